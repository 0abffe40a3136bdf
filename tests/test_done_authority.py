"""A task whose done authority may not approve is refused at the door (kernel/delegation.py), through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_support import new_workspace, run


def test_a_done_authority_that_cannot_approve_is_refused_at_create(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path)
    command = {"type": "create_task", "idempotency_key": "qa-judges", "payload": {
        "sender": "ADMIN", "recipient": "DEV", "subject": "build", "done_authority": "QA"}}
    refused = run("submit", cwd=ws, stdin=json.dumps(command))
    assert refused.code == 2 and refused.json["reason"] == "role_not_authorized", refused
    assert "done_authority QA may not approve" in refused.json["message"]
    assert refused.json["message"].endswith("name a done_authority that may: ADMIN or PM"), refused.json["message"]
    assert json.loads(run("task", "list", "--json", cwd=ws).out) == []
    command["payload"]["done_authority"] = "PM"
    command["idempotency_key"] = "pm-judges"
    assert run("submit", cwd=ws, stdin=json.dumps(command)).json["status"] == "accepted"
