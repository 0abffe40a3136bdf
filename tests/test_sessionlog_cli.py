"""Seed 000 scenarios O0-O6 through the CLI: files stored in inverted order, re-read by fresh processes."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.cli_support import Run
from tests.sessionlog_support import PERM, SCENARIOS, Scenario, cli, line, write_jsonl

EXPECTED_KEYS = {"status", "reason", "order", "excluded", "legacy", "as_of", "state"}


def _run_all(jobs: dict[str, tuple[str, ...]], cwd: Path) -> dict[str, Run]:
    """Each job is its own fresh process; run a few at once to keep the suite fast."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(cli, *args, cwd=cwd) for name, args in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def test_seed_scenarios_under_both_orders_and_as_of(tmp_path: Path) -> None:
    jobs: dict[str, tuple[str, ...]] = {}
    for sc in SCENARIOS:
        path = write_jsonl(tmp_path / f"{sc.name}.jsonl", sc.stored)
        for order in ("record", "acceptance"):
            jobs[f"{sc.name}/{order}"] = ("session", "replay", "--file", str(path), "--order", order,
                                          "--reducer", "permission")
        if sc.name in ("O0", "O1"):
            for order in ("record", "acceptance"):
                jobs[f"{sc.name}/{order}/as-of-1"] = ("session", "replay", "--file", str(path), "--order", order,
                                                      "--as-of", "1", "--reducer", "permission")
    runs = _run_all(jobs, tmp_path)  # cwd has no workspace and no database: --file needs neither

    for sc in SCENARIOS:
        _check(runs[f"{sc.name}/record"], sc, "record", sc.record_order)
        _check(runs[f"{sc.name}/acceptance"], sc, "acceptance", sc.acceptance)
    for name in ("O0", "O1"):
        for order in ("record", "acceptance"):
            run = runs[f"{name}/{order}/as-of-1"]
            assert run.code == 0, run.err
            out = run.json
            # Nothing accepted later leaks into sequence 1, whatever the storage order.
            assert out["as_of"] == 1 and out["order"] == ["a1"] and out["state"]["decision"] == "allow", out
    assert not list(tmp_path.glob("*.db")), "replay --file must not create a database"


def _check(run: Run, sc: Scenario, order: str, expected: str) -> None:
    out = run.json
    assert set(out) == EXPECTED_KEYS, out
    assert out["excluded"] == list(sc.excluded), (sc.name, order, out)
    if expected == "unknown":
        assert run.code == 2, (sc.name, order, run.err)
        assert out["status"] == "unknown" and out["reason"] == sc.reason and out["state"] is None, (sc.name, out)
        assert out["order"] == []
    else:
        assert run.code == 0, (sc.name, order, run.err)
        assert out["status"] == "known" and out["reason"] is None, (sc.name, order, out)
        assert out["state"]["decision"] == expected, (sc.name, order, out)
        assert all(i not in out["order"] for i in sc.excluded)


def test_accept_export_invert_and_replay_from_a_fresh_process(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    first = cli("--db", db, "session", "accept", "s1", "--kind", "allow", "--input-id", "i1",
                "--payload", json.dumps(PERM), cwd=tmp_path)
    second = cli("--db", db, "session", "accept", "s1", "--kind", "revoke", "--input-id", "i2",
                 "--payload", json.dumps(PERM), cwd=tmp_path)
    again = cli("--db", db, "session", "accept", "s1", "--kind", "revoke", "--input-id", "i2",
                "--payload", json.dumps(PERM), cwd=tmp_path)
    assert first.json == {"session": "s1", "input_id": "i1", "accept_seq": 1, "status": "accepted"}
    assert second.json == {"session": "s1", "input_id": "i2", "accept_seq": 2, "status": "accepted"}
    assert again.json == {"session": "s1", "input_id": "i2", "accept_seq": 2, "status": "replayed"}

    exported = cli("--db", db, "session", "export", "s1", cwd=tmp_path)
    assert exported.code == 0, exported.err
    lines = exported.out.splitlines()
    assert [json.loads(x)["accept_seq"] for x in lines] == [1, 2]
    inverted = tmp_path / "inverted.jsonl"
    inverted.write_text("\n".join(reversed(lines)) + "\n", encoding="utf-8")

    runs = _run_all({
        "record": ("session", "replay", "--file", str(inverted), "--order", "record", "--reducer", "permission"),
        "acceptance": ("session", "replay", "--file", str(inverted), "--reducer", "permission"),
        "db": ("--db", db, "session", "replay", "s1", "--reducer", "permission"),
        "inputs": ("session", "replay", "--file", str(inverted)),
    }, tmp_path)
    assert runs["record"].json["state"]["decision"] == "allow"
    assert runs["acceptance"].json["state"]["decision"] == "deny"
    assert runs["db"].json == runs["acceptance"].json
    inputs = runs["inputs"].json["state"]["inputs"]
    assert [(x["seq"], x["input_id"], x["kind"]) for x in inputs] == [(1, "i1", "allow"), (2, "i2", "revoke")]


def test_import_keeps_and_verifies_sequences(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    good = write_jsonl(tmp_path / "good.jsonl", [line("r2", "revoke", 2, log_last_seq=2),
                                                  line("x", "allow", None, accepted=False, reason="policy"),
                                                  line("a1", "allow", 1, log_last_seq=2)])
    imported = cli("--db", db, "session", "import", str(good), cwd=tmp_path)
    assert imported.code == 0, imported.err
    assert imported.json["sessions"]["s1"] == {"imported": 3, "already_present": 0, "last_seq": 2}
    again = cli("--db", db, "session", "import", str(good), cwd=tmp_path)
    assert again.json["sessions"]["s1"] == {"imported": 0, "already_present": 3, "last_seq": 2}
    nxt = cli("--db", db, "session", "accept", "s1", "--kind", "allow", "--input-id", "a3",
              "--payload", json.dumps(PERM), cwd=tmp_path)
    assert nxt.json["accept_seq"] == 3  # the counter continues after the imported sequences

    # Storage order survives the import; the refused record stays excluded.
    rec = cli("--db", db, "session", "replay", "s1", "--order", "record", cwd=tmp_path).json
    assert rec["order"] == ["r2", "a1", "a3"] and rec["excluded"] == ["x"]

    conflict = write_jsonl(tmp_path / "conflict.jsonl", [line("other", "revoke", 2)])
    rejected = cli("--db", db, "session", "import", str(conflict), cwd=tmp_path)
    assert rejected.code == 2 and rejected.json["reason"] in ("sequence_conflict", "missing_sequence")
    gap = write_jsonl(tmp_path / "gap.jsonl", [line("b1", "allow", 1, session="s2"),
                                               line("b3", "allow", 3, session="s2")])
    rejected = cli("--db", db, "session", "import", str(gap), cwd=tmp_path)
    assert (rejected.code, rejected.json["reason"]) == (2, "missing_sequence")
    missing = cli("--db", db, "session", "replay", "s2", cwd=tmp_path)  # nothing of s2 was stored
    assert (missing.code, missing.json["reason"]) == (2, "not_found")


def test_unreadable_file_exits_65_with_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(line("i1", "allow", 1)) + "\n" + '{"session": "s1", "input_id"\n', encoding="utf-8")
    runs = _run_all({"bad": ("session", "replay", "--file", str(path)),
                     "absent": ("session", "replay", "--file", str(tmp_path / "absent.jsonl"))}, tmp_path)
    assert runs["bad"].code == 65, runs["bad"].err
    assert runs["bad"].json["reason"] == "unreadable_file" and "line 2" in runs["bad"].json["message"]
    assert runs["absent"].code == 65 and runs["absent"].json["reason"] == "unreadable_file"


def test_usage_errors_exit_64(tmp_path: Path) -> None:
    runs = _run_all({
        "nothing": ("session", "replay"),
        "order": ("session", "replay", "--file", "x.jsonl", "--order", "sideways"),
        "schema": ("--db", f"sqlite:///{tmp_path / 'k.db'}", "session", "accept", "s", "--kind", "allow",
                   "--input-id", "i", "--payload", '{"permission": "deploy"}'),
    }, tmp_path)
    for name, run in runs.items():
        assert run.code == 64, (name, run.out, run.err)
    assert runs["schema"].json["reason"] == "invalid_input"


def test_idempotency_conflict_and_unknown_session_exit_2(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    cli("--db", db, "session", "accept", "s", "--kind", "message", "--input-id", "i",
        "--payload", '{"text": "hello"}', cwd=tmp_path)
    conflict = cli("--db", db, "session", "accept", "s", "--kind", "message", "--input-id", "i",
                   "--payload", '{"text": "goodbye"}', cwd=tmp_path)
    assert (conflict.code, conflict.json["reason"]) == (2, "idempotency_conflict")
    export = cli("--db", db, "session", "export", "nope", cwd=tmp_path)
    assert (export.code, export.json["reason"]) == (2, "unknown_session")
