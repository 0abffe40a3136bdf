"""Fuzz: hostile and malformed files never crash the file layer; every refused one is quarantined intact.

Default runs take ~20 s; ``-m soak`` runs the same properties with many more examples.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from taskkernel.coordinator.fcop import FcopError, FcopReason, Scanner, open_workspace, parse_envelope, quarantine
from taskkernel.coordinator.fcop.quarantining import printable_path

MAX_BYTES = 4096
GOOD = "---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: PM\npriority: P1\nsubject: s\n---\n\nbody\n"
KEYS = ["protocol", "version", "sender", "recipient", "priority", "references", "transitions", "status",
        "decision", "subject_ref", "reporter", "severity", "subject", "parent", "type"]
_BASE = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                        HealthCheck.filter_too_much])

yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)


@st.composite
def wrong_field(draw: st.DrawFn) -> bytes:
    """The good document with one field set to an arbitrary YAML value (wrong types, missing bits)."""
    fm = yaml.safe_load(GOOD.split("---\n")[1])
    key = draw(st.sampled_from(KEYS))
    if draw(st.booleans()):
        fm[key] = draw(yaml_values)
    else:
        fm.pop(key, None)
    return f"---\n{yaml.safe_dump(fm)}---\n\nbody".encode()


def _mutate(data: bytes, pos: int, junk: bytes) -> bytes:
    pos %= max(len(data), 1)
    return data[:pos] + junk + data[pos + len(junk):]


contents = st.one_of(
    st.binary(max_size=600),
    st.text(max_size=400).map(lambda t: f"---\n{t}\n---\nbody".encode("utf-8", "surrogatepass")),
    wrong_field(),
    st.builds(_mutate, st.just(GOOD.encode()), st.integers(0, 200), st.binary(min_size=1, max_size=8)),
    st.integers(0, len(GOOD)).map(lambda n: GOOD.encode()[:n]),                      # truncated (half-written)
    st.integers(MAX_BYTES + 1, MAX_BYTES * 3).map(lambda n: GOOD.encode() + b"x" * n),  # huge
    st.sampled_from([
        b"---\na: &a [x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b,*b,*b,*b]\n---\n",
        b"---\nx: " + b"[" * 3000 + b"]" * 3000 + b"\n---\n",
        b"---\n!!python/object/apply:os.system ['true']\n---\n",
        b"\xef\xbb\xbf" + GOOD.replace("\n", "\r\n").encode(),
        b"\x00\x01\x02" * 50, b"\xff\xfe" + "---\n".encode("utf-16-le"),
    ]),
)

valid_names = st.builds(
    lambda kind, seq, tail: f"{kind}-20260101-{seq:03d}-{tail}.md",
    st.sampled_from(["TASK", "REPORT", "ISSUE", "REVIEW"]), st.integers(1, 999),
    st.sampled_from(["ADMIN-to-PM", "PM-to-DEV.BACKEND-fix", "QA", "PM-on-task-1", "LEAD-QA-to-AUTO-TESTER"]))
hostile_names = st.builds(
    lambda kind, junk: f"{kind}-{junk}", st.sampled_from(["TASK", "REPORT", "ISSUE", "REVIEW"]),
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="/\x00"), min_size=0, max_size=60)
    | st.sampled_from(["..", "..%2f..%2fetc%2fpasswd.md", "20260101-001-A-to-B..md", "x\\..\\..\\win.ini",
                       "20260101-001-A-to-B.md\n.md", "\x85", "x\u2028y.md", "\u202e" + "dm.exe", "é" * 120 + ".md"]),
).filter(lambda n: len(os.fsencode(n)) <= 250 and not n.endswith(".tmp"))
HOME = {"TASK": "_lifecycle/inbox", "REPORT": "reports", "ISSUE": "issues", "REVIEW": "reviews"}
FOLDERS = ["_lifecycle/inbox", "_lifecycle/active", "reports", "issues", "reviews", "_lifecycle/done/batch"]


@st.composite
def file_spec(draw: st.DrawFn) -> tuple[str, str, tuple[str, bytes]]:
    name = draw(valid_names | hostile_names)
    folder = HOME[name.split("-", 1)[0]] if draw(st.integers(0, 4)) else draw(st.sampled_from(FOLDERS))
    what = draw(st.one_of(contents.map(lambda c: ("file", c)),
                          st.sampled_from([("symlink", b"outside"), ("symlink", b"dangling"), ("symlink", b"dir"),
                                           ("fifo", b"")])))
    return folder, name, what


file_specs = st.lists(file_spec(), min_size=1, max_size=25)


def _check_batch(specs: list[tuple[str, str, tuple[str, bytes]]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        outside = Path(tmp) / "outside-secret.txt"
        outside.write_bytes(b"secret")
        ws = open_workspace(Path(tmp) / "proj", create=True)
        expected: dict[str, tuple[str, bytes]] = {}
        for folder, name, (what, data) in specs:
            path = ws.root / folder / name
            rel = ws.relative(path)
            if rel in expected:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if what == "file":
                path.write_bytes(data)
            elif what == "fifo":
                os.mkfifo(path)
            else:
                path.symlink_to({b"outside": outside, b"dangling": Path(tmp) / "nope", b"dir": Path("/")}[data])
            expected[rel] = (what, data)
        batch = Scanner(ws, settle_s=0, grace_s=0, max_bytes=MAX_BYTES).scan()
        seen = {e.rel for e in batch.ready} | {e.rel for e in batch.invalid}
        assert seen == set(expected), "every file is either ready or refused"
        for entry in batch.invalid:
            assert entry.error is not None
            event(entry.error.reason.value)
            quarantine(ws, entry.path, entry.error.reason, entry.error.message)
        sources = {}
        for reason_file in ws.quarantine_dir.glob("*.reason.md") if ws.quarantine_dir.exists() else []:
            meta = yaml.safe_load(reason_file.read_text().split("---\n")[1])
            assert FcopReason(meta["reason"])
            sources[meta["source"]] = ws.quarantine_dir / reason_file.name[: -len(".reason.md")]
        assert set(sources) == {printable_path(e.rel) for e in batch.invalid}
        for entry in batch.invalid:
            rel, moved = entry.rel, sources[printable_path(entry.rel)]
            what, data = expected[rel]
            assert not os.path.lexists(ws.root / rel)
            if what == "file":
                assert hashlib.sha256(moved.read_bytes()).digest() == hashlib.sha256(data).digest()
            elif what == "symlink":
                assert moved.is_symlink()
        for entry in batch.ready:
            assert (ws.root / entry.rel).read_bytes() == expected[entry.rel][1]
        assert outside.read_bytes() == b"secret"


@settings(_BASE, max_examples=200)
@given(file_specs)
def test_hostile_workspace_is_scanned_and_quarantined_without_loss(
        specs: list[tuple[str, str, tuple[str, bytes]]]) -> None:
    _check_batch(specs)


@settings(_BASE, max_examples=2500)
@given(valid_names | hostile_names, contents)
def test_parser_only_ever_returns_a_model_or_a_reason(name: str, data: bytes) -> None:
    try:
        parse_envelope(name, data, max_bytes=MAX_BYTES)
    except FcopError as exc:
        assert exc.reason in FcopReason and exc.message


@pytest.mark.soak
@settings(_BASE, max_examples=3000)
@given(file_specs)
def test_soak_hostile_workspaces(specs: list[tuple[str, str, tuple[str, bytes]]]) -> None:
    _check_batch(specs)


@pytest.mark.soak
@settings(_BASE, max_examples=100_000)
@given(valid_names | hostile_names, contents)
def test_soak_parser(name: str, data: bytes) -> None:
    try:
        parse_envelope(name, data, max_bytes=MAX_BYTES)
    except FcopError as exc:
        assert exc.reason in FcopReason
