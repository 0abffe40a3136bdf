"""Who an input was accepted from is recorded from the credential and survives export/import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskkernel.kernel.sessionlog import SessionLog, SessionLogError, parse_lines
from taskkernel.kernel.store.db import Database
from tests.cli_support import taskkernel


def test_cli_records_the_credential_not_the_payload(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert taskkernel("init", str(ws), cwd=tmp_path).returncode == 0
    tool = taskkernel("token", "issue", "TOOL", "--agent", "env-probe", cwd=ws).stdout.strip()
    obs = {"tool": "get_env", "status": "ok", "entity": "env:current", "key": "name", "value": "staging"}
    r = taskkernel("--token", tool, "session", "accept", "admin", "--kind", "observation", "--input-id", "o1",
                   "--payload", json.dumps({**obs, "accepted_by": "ADMIN:local-owner"}), cwd=ws)
    assert json.loads(r.stdout)["accept_seq"] == 1
    r = taskkernel("session", "accept", "admin", "--kind", "message", "--input-id", "m1", "--payload",
                   json.dumps({"text": "go"}), cwd=ws)
    assert json.loads(r.stdout)["accept_seq"] == 2
    forged = taskkernel("--token", "tk_nope", "session", "accept", "admin", "--kind", "message", "--input-id", "m2",
                        "--payload", json.dumps({"text": "x"}), cwd=ws)
    assert forged.returncode == 2 and json.loads(forged.stdout)["reason"] == "actor_unverified"
    lines = [json.loads(x) for x in taskkernel("session", "export", "admin", cwd=ws).stdout.splitlines()]
    assert [x["accepted_by"] for x in lines] == ["TOOL:env-probe", "ADMIN:local-owner"]


def test_accepted_by_survives_export_and_import(sqlite_db: Database, tmp_path: Path) -> None:
    log = SessionLog(sqlite_db)
    log.accept("s", {"input_id": "g", "kind": "allow", "payload": {"permission": "write", "scope": "file:*"}},
               accepted_by="ADMIN:alice")
    lines = list(log.export("s"))
    other = SessionLog(Database(f"sqlite:///{tmp_path / 'other.db'}"))
    other.import_records(parse_lines(lines))
    assert [r.accepted_by for r in other.records("s")] == ["ADMIN:alice"]


def test_observation_payload_is_validated(sqlite_db: Database) -> None:
    log = SessionLog(sqlite_db)
    with pytest.raises(SessionLogError) as err:
        log.accept("s", {"input_id": "o", "kind": "observation", "payload": {"tool": "t", "status": "maybe",
                                                                            "entity": "e", "key": "k"}})
    assert err.value.reason == "invalid_input"
    ok = log.accept("s", {"input_id": "o", "kind": "observation", "payload": {
        "tool": "t", "status": "timeout", "entity": "e", "key": "k", "value": None}})
    assert ok.accept_seq == 1
