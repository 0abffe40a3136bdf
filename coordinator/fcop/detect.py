"""Find the FCoP workspace root and tell which generation of the protocol wrote it (digest §1).

Detection runs before anything is written: a G4 ("Core 4.0") workspace goes to fcop's Core
(``coordinator/fcop4``), a MIXED one (G2 ``tasks/``/``log/`` beside G3 ``_lifecycle/``) is
refused unless the caller asks to read it anyway, and an empty one is laid
out as G3.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from taskkernel.coordinator.fcop.errors import FcopError, FcopReason
from taskkernel.coordinator.fcop.filenames import EnvelopeKind
from taskkernel.coordinator.fcop.safeio import confine, ensure_dir

STAGES = ("inbox", "active", "review", "done", "archive")
LIFECYCLE_DIR = "_lifecycle"
QUARANTINE_DIR = "_quarantine"
LOCK_DIR = ".locks"
CONFIG_NAME = "fcop.json"
G2_MARKERS = ("tasks", "log")
BUCKETS = {EnvelopeKind.REPORT: "reports", EnvelopeKind.ISSUE: "issues", EnvelopeKind.REVIEW: "reviews"}
_ROOT_CANDIDATES = ("fcop", "docs/agents")
SCAN_DEPTH = 4  # folders below an envelope folder that scans and numbering look into (history/<date>/<stem>/)


class Generation(StrEnum):
    EMPTY = "empty"   # nothing yet: we lay it out as G3
    G2 = "g2"         # five buckets: tasks/ reports/ issues/ shared/ log/
    G3 = "g3"         # _lifecycle/{inbox,active,review,done,archive}/
    G4 = "g4"         # Core 4.0 manifest (protocol_version "4.0"): read and written through fcop's Core
    MIXED = "mixed"   # G2 and G3 side by side (a half-finished migration)


@dataclass(frozen=True)
class FcopWorkspace:
    """A detected workspace: its root folder, generation and team config (``fcop.json``).

    Its root is confined (see ``safeio.confine``): no write below it ever passes through a symlink.
    """

    root: Path
    generation: Generation
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        confine(self.root)

    @property
    def lifecycle_dir(self) -> Path:
        return self.root / LIFECYCLE_DIR

    def stage_dir(self, stage: str) -> Path:
        if stage not in STAGES:
            raise ValueError(f"unknown lifecycle stage {stage!r}")
        return self.lifecycle_dir / stage

    @property
    def inbox_dir(self) -> Path:
        """Where a new TASK goes: ``_lifecycle/inbox/`` (G3) or ``tasks/`` (G2)."""
        return self.root / "tasks" if self.generation is Generation.G2 else self.stage_dir("inbox")

    def bucket_dir(self, kind: EnvelopeKind) -> Path:
        """Flat bucket of REPORT/ISSUE/REVIEW files (same path in G2 and G3)."""
        return self.root / BUCKETS[kind]

    @property
    def quarantine_dir(self) -> Path:
        return self.root / QUARANTINE_DIR

    @property
    def lock_dir(self) -> Path:
        return self.root / LOCK_DIR

    def envelope_dirs(self, kind: EnvelopeKind) -> list[Path]:
        """Every folder a file of ``kind`` can live in (searched ``SCAN_DEPTH`` folders deep by scans and numbering)."""
        if kind is EnvelopeKind.TASK:
            dirs = [self.stage_dir(s) for s in STAGES] + [self.root / "tasks", self.root / "log" / "tasks"]
        else:
            dirs = [self.bucket_dir(kind), self.root / "log" / BUCKETS[kind]]
        if kind is EnvelopeKind.REPORT:
            dirs.append(self.stage_dir("archive"))  # fcop 3.x's classifier allows REPORTs beside archived TASKs
        if kind in (EnvelopeKind.TASK, EnvelopeKind.REPORT):
            dirs.append(self.root / "history")
        return dirs

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


def _has_markers(path: Path) -> bool:
    return (path / CONFIG_NAME).is_file() or (path / LIFECYCLE_DIR).is_dir() or any(
        (path / m).is_dir() for m in G2_MARKERS)


def find_workspace_root(path: Path) -> Path:
    """``<path>/fcop`` or ``<path>/docs/agents`` (never both), else ``path`` itself if it is one.

    A folder that is neither defaults to ``<path>/fcop`` (where a new G3 workspace goes).
    """
    path = Path(path)
    found = [path / c for c in _ROOT_CANDIDATES if (path / c).is_dir()]
    if len(found) == 2:
        raise FcopError(FcopReason.AMBIGUOUS_WORKSPACE_ROOT,
                        f"both {found[0]} and {found[1]} exist; FCoP refuses to guess (ADR-0022). "
                        "Remove one or point at the workspace folder itself.", path)
    if found:
        return found[0]
    if _has_markers(path):
        return path
    return path / "fcop"


def read_config(root: Path) -> dict[str, Any]:
    """``fcop.json`` as a dict ({} when absent). An unreadable one is refused: it might be a G4 manifest."""
    cfg = root / CONFIG_NAME
    try:
        raw = cfg.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FcopError(FcopReason.MALFORMED_CONFIG, f"cannot read {cfg}: {exc}", cfg) from exc
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FcopError(FcopReason.MALFORMED_CONFIG, f"{cfg} is not valid JSON: {exc}", cfg) from exc
    if not isinstance(data, dict):
        raise FcopError(FcopReason.MALFORMED_CONFIG, f"{cfg} must hold a JSON object", cfg)
    return data


def detect_generation(root: Path, config: dict[str, Any] | None = None) -> Generation:
    """Digest §1.4: manifest ``protocol_version`` 4.x → G4; else ``_lifecycle/`` → G3, ``tasks/``/``log/`` → G2."""
    config = read_config(root) if config is None else config
    if str(config.get("protocol_version", "")).startswith("4") or (root / "operations").is_dir():
        return Generation.G4
    g3 = (root / LIFECYCLE_DIR).is_dir()
    g2 = any((root / m).is_dir() for m in G2_MARKERS)
    if g3 and g2:
        return Generation.MIXED
    if g3:
        return Generation.G3
    return Generation.G2 if g2 else Generation.EMPTY


def open_workspace(path: Path | str, *, allow_mixed: bool = False, create: bool = False) -> FcopWorkspace:
    """Locate and classify a workspace; refuse G4 (and MIXED unless ``allow_mixed``).

    ``create=True`` lays out an EMPTY workspace as G3 (the five stages plus the
    flat buckets), so the result is then G3.
    """
    root = find_workspace_root(Path(path))
    if root.is_symlink():
        raise FcopError(FcopReason.SYMLINK_REFUSED, f"{root} is a symbolic link: the kernel never writes through "
                        "one. Point it at the folder itself.", root)
    config = read_config(root)
    generation = detect_generation(root, config)
    if generation is Generation.G4 and root.name != "fcop":
        raise FcopError(FcopReason.UNSUPPORTED_WORKSPACE_GENERATION,
                        f"{root} is an FCoP 4.0 (G4) manifest outside fcop/: fcop's Core reads a G4 workspace only "
                        "at <project>/fcop.", root)
    if generation is Generation.MIXED and not allow_mixed:
        raise FcopError(FcopReason.MIXED_WORKSPACE,
                        f"{root} has both _lifecycle/ (G3) and tasks/ or log/ (G2): a half-finished "
                        "migration. Empty or remove the G2 folders first.", root)
    if create and generation is Generation.EMPTY:
        confine(root)
        for d in [root / LIFECYCLE_DIR / s for s in STAGES] + [root / b for b in BUCKETS.values()]:
            ensure_dir(d)
        generation = Generation.G3
    return FcopWorkspace(root=root, generation=generation, config=config)
