"""Every envelope of a G4 workspace that fcop's Core validates, as plain records; the others with their reason.

Read with fcop 4.0.5's own validation (schema, canonical path, directory/transition agreement, provable attempt),
one file at a time, so one bad file never hides the rest.
"""

from __future__ import annotations

import hashlib
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskkernel.coordinator.fcop import DEFAULT_MAX_BYTES, FcopError, safeio

STAGES = ("inbox", "active", "review", "done", "archive")
BUCKETS = {"REPORT": "reports", "REVIEW": "reviews", "ISSUE": "issues"}


@dataclass(frozen=True)
class G4Envelope:
    kind: str                    # TASK, REPORT, REVIEW or ISSUE
    id: str                      # its <kind>_id
    rel: str                     # path relative to the FCoP root
    sha256: str                  # of the exact bytes (the evidence digest fcop binds)
    fields: dict[str, Any]
    body: str
    stage: str | None = None     # TASK: the folder it is in (the NOW truth)
    attempt_id: str | None = None  # TASK: its current attempt

    @property
    def attempts(self) -> list[str]:
        """A TASK's attempt ids in order (one per entry to active)."""
        return [t["attempt_id"] for t in self.fields.get("transitions", []) if t.get("attempt_id")]

    @property
    def last_by(self) -> str | None:
        transitions = self.fields.get("transitions") or [{}]
        return transitions[-1].get("by")


@dataclass
class G4Listing:
    tasks: dict[str, G4Envelope] = field(default_factory=dict)
    records: list[G4Envelope] = field(default_factory=list)  # REPORTs, REVIEWs, ISSUEs, oldest first
    invalid: dict[str, tuple[str, str]] = field(default_factory=dict)  # rel -> (sha256, "<CODE>: message")


def _body(data: bytes) -> str:
    return data.decode("utf-8").split("---\n", 2)[2].removeprefix("\n")


def planted_entries(fcop_root: Path) -> list[Path]:
    """Links, FIFOs, sockets and devices in a stage or bucket folder: fcop's Core refuses a workspace with a link in
    it and blocks opening a FIFO, for fcop-mcp as for us, so none may stay there."""
    found = []
    for folder in (*(f"_lifecycle/{s}" for s in STAGES), *BUCKETS.values()):
        try:
            entries = safeio.list_dir(fcop_root / folder)
        except (FileNotFoundError, FcopError):
            continue
        found += [fcop_root / folder / name for name, st in entries
                  if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode)]
    return found


def read_workspace(project_root: Path, known: dict[str, str] | None = None) -> G4Listing:
    """What fcop's Core validates below ``<project_root>/fcop``; a file ``known`` holds with the same sha256 is
    left out unread by the Core (a live pass then costs what changed: the Core parses with pure-Python YAML)."""
    known = known or {}
    from fcop import Project
    from fcop.v4.creation import _Creation  # noqa: PLC2701
    from fcop.workspace import _envelope  # noqa: PLC2701 - the Core's own per-file check (list_envelopes stops at one bad file)

    project = Project(project_root)
    creation = _Creation.open_if_declared(project.path)
    listing = G4Listing()
    if creation is None:  # fcop.json is not (or no longer) a G4 manifest
        listing.invalid["fcop.json"] = ("", "UNSUPPORTED_WORKSPACE_VERSION: not an FCoP 4.0 manifest")
        return listing
    root = project_root / "fcop"
    folders = [(f"_lifecycle/{s}", "TASK") for s in STAGES] + [(b, k) for k, b in BUCKETS.items()]
    for folder, kind in folders:
        directory = root / folder
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob(f"{kind}-*.md")):
            rel = path.relative_to(root).as_posix()
            try:  # never through a link, never a FIFO or device, never more than a TASK may weigh
                data, _ = safeio.read_bytes(path, DEFAULT_MAX_BYTES)
            except FileNotFoundError:
                continue  # moved on meanwhile
            except FcopError as exc:
                listing.invalid[rel] = ("", f"{exc.reason.value}: {exc.message}")
                continue
            sha = hashlib.sha256(data).hexdigest()
            if known.get(rel) == sha:
                continue
            try:
                fields = _envelope(project, creation, path)
            except Exception as exc:  # noqa: BLE001 - one file (bad YAML nesting, a race) never stops the others
                listing.invalid[rel] = (sha, f"{getattr(exc, 'code', type(exc).__name__)}: {exc}"[:500])
                continue
            clean = {k: v for k, v in fields.items()
                     if k not in ("path", "warnings", "stage", "content_digest", "last_transition",
                                  "current_attempt_id")}
            env = G4Envelope(kind=kind, id=fields[f"{kind.lower()}_id"], rel=rel,
                             sha256=sha, fields=clean, body=_body(data),
                             stage=fields.get("stage"), attempt_id=fields.get("current_attempt_id"))
            if kind == "TASK":
                listing.tasks[env.id] = env
            else:
                listing.records.append(env)
    listing.records.sort(key=lambda e: (str(e.fields.get("created_at", "")), e.id))
    return listing
