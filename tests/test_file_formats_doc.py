"""docs/file-formats.md says what the readers and the kernel do, so it cannot drift from them.

The page marks each example file with a line of its own, followed by the file in a ```markdown block:

    File `<path below the FCoP root>`, written by <ROLE>:        an agent's file, taken in by the kernel
    File `<path below the FCoP root>`, as the kernel left it:    what the kernel wrote (timestamps aside)

Every example is parsed by taskkernel's reader and fcop's, scanned where the page puts it, and the story the page
tells is played through a real kernel: the agents' files go in in page order, the second task goes through
commands, and then the workspace holds exactly the files the page shows. The names table and the field tables
are checked against both readers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from fcop.compatibility.v3 import project as fcop_v3
from fcop.core.filename import (
    parse_issue_filename,
    parse_report_filename,
    parse_review_filename,
    parse_task_filename,
)
from fcop.models import ReviewSubjectType

from taskkernel.coordinator.fcop import FcopError, FcopReason, Scanner, open_workspace, parse_envelope
from taskkernel.coordinator.fcop.filenames import envelope_prefix, parse_filename, subject_short_for
from taskkernel.coordinator.fcop.models import (
    ISSUE_STATUSES,
    PRIORITY_ALIASES,
    PROTOCOL_ALIASES,
    REPORT_STATUSES,
    REVIEW_DECISIONS,
    SEVERITY_ALIASES,
)
from taskkernel.kernel.model.commands import RiskLevel
from taskkernel.kernel.model.principal import Principal
from tests.coord_support import coordinator, make_workspace
from tests.fcop_oracle import accepted, chain_problems

DOC = Path(__file__).resolve().parent.parent / "docs" / "file-formats.md"
EXAMPLE = re.compile(r"^File `(?P<path>[^`]+)`, (?:written by (?P<role>[A-Z][A-Z0-9_-]*)|as the kernel left it):\n"
                     r"\n```markdown\n(?P<text>.*?)^```$", re.M | re.S)
STORY_DAY, NEXT_DAY = "20260115", "20260116"  # the page's two days; the kernel's own files get today's date
KINDS = ("TASK", "REPORT", "REVIEW", "ISSUE")
FCOP_NAME = {"TASK": parse_task_filename, "REPORT": parse_report_filename, "REVIEW": parse_review_filename,
             "ISSUE": parse_issue_filename}
# the values a field's "type and values" cell must list: exactly what the readers take
ENUMS: dict[tuple[str, str], set[str]] = {
    **{(kind, "protocol"): set(PROTOCOL_ALIASES) for kind in KINDS},
    **{(kind, "type"): {kind.lower()} for kind in KINDS},
    ("TASK", "priority"): set(PRIORITY_ALIASES), ("REPORT", "priority"): set(PRIORITY_ALIASES),
    ("TASK", "risk_level"): {r.value for r in RiskLevel},
    ("REPORT", "status"): set(REPORT_STATUSES),
    ("REVIEW", "decision"): set(REVIEW_DECISIONS),
    ("REVIEW", "subject_type"): {t.value for t in ReviewSubjectType},
    ("ISSUE", "severity"): set(SEVERITY_ALIASES), ("ISSUE", "status"): set(ISSUE_STATUSES),
}
HEADER_ONLY = b"---\nprotocol: fcop\nversion: 1\n---\n"


@dataclass(frozen=True)
class Example:
    path: str  # below the FCoP root
    text: str
    author: str | None  # the role that wrote it; None: the kernel

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    @property
    def kind(self) -> str:
        head = self.name.split("-", 1)[0]
        assert head in KINDS, self.name
        return head

    @property
    def data(self) -> bytes:
        return self.text.encode("utf-8")

    def __str__(self) -> str:
        return f"{self.path} ({self.author or 'kernel'})"


def page() -> str:
    return DOC.read_text(encoding="utf-8")


def examples() -> list[Example]:
    return [Example(m["path"], m["text"], m["role"]) for m in EXAMPLE.finditer(page())]


def section(title: str) -> str:
    """The text of the page's ``## <title>`` section."""
    parts = re.split(r"^## (.+)$", page(), flags=re.M)
    found = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert title in found, f"no section '## {title}' in {DOC.name}"
    return found[title]


def table(text: str, header: str) -> list[list[str]]:
    """The rows (cells, stripped) of the first Markdown table in ``text`` whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def code(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def fcop_reads(kind: str, path: Path) -> bool:
    """Does fcop's own strict reader accept this file?"""
    loaders = {"TASK": lambda: fcop_v3._load_task_strict(path, is_archived=False),
               "REPORT": lambda: fcop_v3._load_report_strict(path, is_archived=False),
               "REVIEW": lambda: fcop_v3._load_review_strict(path, is_archived=False),
               "ISSUE": lambda: fcop_v3._load_issue_strict(path)}
    try:
        loaders[kind]()
    except Exception:  # noqa: BLE001 - whatever fcop raises, it does not accept the file
        return False
    return True


def variant(example: Example, **changes: Any) -> bytes:
    """The example with front-matter keys changed (None: removed); the others as they were, in order."""
    _, front, body = example.text.split("---\n", 2)
    fm = yaml.safe_load(front)
    for key, value in changes.items():
        if value is None:
            fm.pop(key)
        else:
            fm[key] = value
    return f"---\n{yaml.safe_dump(fm, sort_keys=False, allow_unicode=True)}---\n{body}".encode()


def author_of(env: Any) -> str:
    return getattr(env, "sender", None) or getattr(env, "reporter", None) or env.reviewer


# --- the examples ---------------------------------------------------------------------------------------------


def test_the_page_has_a_worked_example_of_each_kind() -> None:
    found = examples()
    assert {e.kind for e in found if e.author} == set(KINDS), "an example of each kind as an agent writes it"
    assert {e.kind for e in found if not e.author} == {"TASK", "REPORT", "REVIEW"}, "and as the kernel writes it"
    for e in found:  # each under its own kind's heading
        assert f"File `{e.path}`" in section(e.kind), e
    reviews = [e.name for e in found if e.kind == "REVIEW"]
    assert reviews and all(re.search(r"-on-task-\d{8}-\d{3}\.md$", n) for n in reviews), reviews


@pytest.mark.parametrize("example", examples(), ids=str)
def test_each_example_is_read_by_taskkernel_as_it_says(example: Example) -> None:
    env = parse_envelope(example.name, example.data)
    assert env.kind.value == example.kind
    assert env.warnings == (), "an example reads without a warning"
    if example.author:
        assert author_of(env) == example.author, "written by the role its front matter names"
    rows = {code(r[0])[0] for r in table(section(example.kind), "| field |")}
    assert set(env.front_matter) <= rows, f"fields of the example missing from the {example.kind} table"


def test_fcop_reads_each_example(tmp_path: Path) -> None:
    for e in examples():
        path = tmp_path / e.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(e.data)
        assert FCOP_NAME[e.kind](e.name) is not None, f"fcop's parser refuses the name {e.name}"
        assert fcop_reads(e.kind, path), f"fcop's reader refuses {e}"
        if e.kind == "TASK":
            assert chain_problems(path) == [], e
    listed = {a.rel for a in accepted(tmp_path)}
    assert listed == {e.path for e in examples() if e.kind != "ISSUE"}


def test_each_example_lives_where_its_kind_is_read(tmp_path: Path) -> None:
    (tmp_path / "_lifecycle").mkdir()  # a G3 workspace
    for e in examples():
        (tmp_path / e.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / e.path).write_bytes(e.data)
    batch = Scanner(open_workspace(tmp_path), settle_s=0, grace_s=0).scan()
    assert [(i.rel, i.error) for i in batch.invalid] == []
    assert {r.rel for r in batch.ready} == {e.path for e in examples()}
    for entry in batch.ready:
        if entry.stage is not None:  # a TASK's folder is its state
            assert entry.rel == f"_lifecycle/{entry.stage}/{entry.path.name}"


# --- the story ------------------------------------------------------------------------------------------------


STAMP = re.compile(r"'\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?\+00:00'")


def normalized(text: str) -> str:
    """Timestamps out, and the kernel's own date (today) as the page's second day."""
    text = STAMP.sub("'<time>'", text)
    return re.sub(r"(?<!\d)20\d{6}(?!\d)", lambda m: m[0] if m[0] == STORY_DAY else NEXT_DAY, text)


def test_the_story_plays_as_the_page_tells_it(tmp_path: Path) -> None:
    if datetime.now(UTC).strftime("%Y%m%d") == STORY_DAY:
        pytest.skip("the kernel's own files would be dated like the agents' ones")
    ws = make_workspace(tmp_path / "ws", {})
    root = ws.root / "fcop"
    c = coordinator(ws)
    c.run_once()  # the import: nothing yet, so every file below is live input
    for e in [e for e in examples() if e.author]:  # the agents' files, in page order
        (root / e.path).write_bytes(e.data)
        c.run_once()
    first = c.kernel.task(f"TASK-{STORY_DAY}-001")
    assert first is not None and first["state"] == "done"
    assert [r["report_id"] for r in first["reports"]] == [f"REPORT-{STORY_DAY}-001"]

    def command(kind: str, role: str, task_id: str | None = None, **payload: Any) -> str:
        cmd: dict[str, Any] = {"type": kind, "idempotency_key": f"page:{kind}", "payload": payload}
        if task_id is not None:
            doc = c.kernel.task(task_id)
            cmd.update(task_id=task_id, thread_key=doc["thread_key"], expected_revision=doc["revision"],
                       round=doc["round"])
        result = c.kernel.submit(cmd, Principal(role, f"{role.lower()}-agent"))
        assert result.status == "accepted", result
        return str(result.task_id)

    # the second task, through commands only
    second = command("create_task", "PM", sender="PM", recipient="DEV", subject="Add a logout button",
                     body="Put a logout button in the page header.")
    command("claim", "DEV", second)
    command("submit_report", "DEV", second, status="done", body="The button is in the header.")
    command("submit", "DEV", second)
    command("reject", "PM", second, reason="The button is not shown on small screens.")
    c.run_once()
    assert c.kernel.task(second)["state"] == "active"

    on_disk = {normalized(p.relative_to(root).as_posix()): normalized(p.read_text(encoding="utf-8"))
               for p in root.rglob("*") if p.is_file() and parse_filename(p.name) is not None}
    shown = {normalized(e.path): normalized(e.text) for e in examples()
             if not e.author or e.kind != "TASK"}  # an agent's TASK moves on; its other files stay as written
    assert on_disk == shown, "the workspace holds exactly the files the page shows"
    assert not list(root.rglob("_reason.*")) and not list(root.rglob("_quarantine/*")), "nothing was refused"


def test_what_the_page_says_about_hand_written_tasks(tmp_path: Path) -> None:
    """Without `transitions` the kernel writes the creation entry; a slot is in the name, not in `recipient`; a
    risk level the kernel does not know is refused with a note."""
    example = next(e for e in examples() if e.kind == "TASK" and e.author)
    ws = make_workspace(tmp_path / "ws", {})
    inbox = ws.root / "fcop" / "_lifecycle" / "inbox"
    c = coordinator(ws)
    c.run_once()
    files = {"TASK-20260115-001-PM-to-DEV.md": variant(example, transitions=None),
             "TASK-20260115-002-PM-to-DEV.BACKEND.md": variant(example),
             "TASK-20260115-003-PM-to-DEV.BACKEND.md": variant(example, recipient="DEV.BACKEND"),
             "TASK-20260115-004-PM-to-DEV.md": variant(example, risk_level="extreme")}
    for name, data in files.items():
        (inbox / name).write_bytes(data)
    c.run_once()
    entries = parse_envelope("TASK-20260115-001-PM-to-DEV.md",
                             (inbox / "TASK-20260115-001-PM-to-DEV.md").read_bytes()).transitions  # type: ignore[union-attr]
    assert [(t.from_stage, t.to, t.by, t.tool, type((t.model_extra or {}).get("kernel_event"))) for t in entries] \
        == [(None, "inbox", "PM", "create_task", int)]
    assert c.kernel.task("TASK-20260115-002")["recipient"] == "DEV"
    for refused in ("TASK-20260115-003-PM-to-DEV.BACKEND.md", "TASK-20260115-004-PM-to-DEV.md"):
        assert c.kernel.task(refused[:17]) is None
        assert (inbox / f"_reason.{refused}.txt").is_file(), refused


# --- names and fields -----------------------------------------------------------------------------------------


def name_rows() -> list[tuple[str, str]]:
    return [(code(r[0])[0], r[1]) for r in table(section("File names"), "| name | result |")]


def test_the_names_table_covers_what_a_reader_needs() -> None:
    results = [result.split(":")[0].split(" ")[0] for _, result in name_rows()]
    assert {"valid", "`bad_filename`", "`invalid_task_id`", "ghost"} <= set(results)
    assert ("REVIEW-20260115-001-PM-on-TASK-20260115-001.md", "`bad_filename`") in \
        {(n, r.split(":")[0]) for n, r in name_rows()}, "the upper-case REVIEW name is refused"
    for kind in KINDS:
        assert any(n.startswith(kind) and r.startswith("valid") for n, r in name_rows()), kind


@pytest.mark.parametrize(("name", "result"), name_rows())
def test_each_name_is_what_the_table_says(name: str, result: str, tmp_path: Path) -> None:
    kind = envelope_prefix(name)
    if result.startswith("ghost"):
        assert kind is None
        (tmp_path / "_lifecycle" / "inbox").mkdir(parents=True)
        (tmp_path / "_lifecycle" / "inbox" / name).write_bytes(HEADER_ONLY)
        batch = Scanner(open_workspace(tmp_path), settle_s=0, grace_s=0).scan()
        assert [g.path.name for g in batch.ghosts] == [name] and not batch.ready and not batch.invalid
        return
    assert kind is not None
    parsed = parse_filename(name)
    if result.startswith("valid"):
        assert parsed is not None
        assert (FCOP_NAME[kind.value](name) is not None) == ("fcop's reader refuses it" not in result)
        said = dict(re.findall(r"\b(task|report|review|issue|slug|slot) `([^`]+)`", result))
        assert said.get(kind.value.lower(), parsed.id) == parsed.id
        assert said.get("slug", parsed.slug) == parsed.slug and said.get("slot", parsed.slot) == parsed.slot
        return
    reason = FcopReason(code(result)[0])
    with pytest.raises(FcopError) as refused:
        parse_envelope(name, HEADER_ONLY)
    assert refused.value.reason is reason
    if reason is FcopReason.BAD_FILENAME:
        assert parsed is None and FCOP_NAME[kind.value](name) is None, "fcop refuses the name too"


@pytest.mark.parametrize(("subject_ref", "short"), [
    ("TASK-20260115-001", "task-20260115-001"),
    ("_lifecycle/inbox/TASK-20260115-001-PM-to-DEV.md", "task-20260115-001-pm-to-dev"),
    ("docs/ADR 17: Review files!.md", "adr-17-review-files"),
    ("commit:3c35e0e", "commit-3c35e0e"),
    ("x" * 63 + "-yz", "x" * 63),
])
def test_the_review_name_rule_is_fcops(subject_ref: str, short: str) -> None:
    """The page's rule for `-on-<subject>`, as taskkernel and fcop's writer apply it."""
    assert subject_short_for(subject_ref) == short == fcop_v3._derive_review_subject_short(subject_ref)


@pytest.mark.parametrize("kind", KINDS)
def test_the_field_table_says_what_the_readers_require(kind: str, tmp_path: Path) -> None:
    example = next(e for e in examples() if e.kind == kind and e.author)
    fm = parse_envelope(example.name, example.data).front_matter
    rows = table(section(kind), "| field |")
    assert [r[1] for r in rows if r[1] not in ("yes", "fcop", "no")] == [], "required is yes, fcop or no"
    path = tmp_path / example.name
    for cells in rows:
        field, required = code(cells[0])[0], cells[1]
        if (kind, field) in ENUMS:
            assert {v.lower() for v in code(cells[2])} == ENUMS[kind, field], f"values of {kind} {field}"
        if field not in fm:
            assert required == "no", f"the {kind} example leaves out {field}, which it says is required"
            continue
        data = variant(example, **{field: None})
        path.write_bytes(data)
        if required == "yes":
            with pytest.raises(FcopError) as refused:
                parse_envelope(example.name, data)
            assert refused.value.reason is FcopReason.MISSING_REQUIRED_FIELD, field
            assert not fcop_reads(kind, path), f"fcop reads a {kind} without {field}"
        else:
            parse_envelope(example.name, data)
            assert fcop_reads(kind, path) == (required == "no"), f"{kind} without {field}: fcop's reader"


def test_a_task_file_never_says_its_state() -> None:
    for e in examples():
        if e.kind == "TASK":
            assert not {"state", "stage", "status"} & set(yaml.safe_load(e.text.split("---\n")[1])), e
