"""Role modules: built-in presets, least privilege for unknown roles, installed third-party packages."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.commands import CommandType
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import metadata
from taskkernel.roles import builtin
from taskkernel.roles.protocol import ALL_COMMANDS, AssignScope, RoleSpec
from taskkernel.roles.registry import RoleRegistry, discover_plugins
from tests.coord_support import admin_task, coordinator, make_workspace


def test_presets_give_leader_and_workers_their_powers() -> None:
    reg = RoleRegistry.for_team("PM", ["PM", "DEV", "QA", "OPS"], load_plugins=False)
    assert reg.get("PM").may_issue(CommandType.APPROVE)
    assert not reg.get("DEV").may_issue(CommandType.APPROVE)
    assert reg.get("DEV").assign_scope is AssignScope.LEADER
    assert reg.get("ADMIN").may_issue(CommandType.FORCE_ARCHIVE)


def test_unknown_role_gets_least_privilege() -> None:
    spec = RoleRegistry.for_team("ME", ["ME"], load_plugins=False).get("AUDITOR")
    assert spec.commands == frozenset({CommandType.CLAIM, CommandType.SUBMIT, CommandType.SUBMIT_REPORT,
                                     CommandType.PERFORM})
    assert spec.assign_scope is AssignScope.NOBODY


def test_installed_role_package_is_discovered() -> None:
    specs = {s.code: s for s in discover_plugins()}
    if "REVIEWER" not in specs:
        pytest.fail("the example role package is not installed: `make setup` installs "
                    "examples/taskkernel-role-reviewer")
    reg = RoleRegistry.for_team("PM", ["PM", "DEV"])
    assert reg.known("REVIEWER") and reg.get("REVIEWER").handler is not None


def test_installed_role_runs_its_own_handler_under_the_coordinator(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", {"REVIEWER": {"runner": "scripted"}})
    c = coordinator(ws)
    tid = admin_task(c, subject="Spec draft", recipient="REVIEWER")
    c.run_once()
    doc = c.kernel.task(tid)
    assert doc["state"] == "review"
    assert [e.data.get("body") for e in c.kernel.history(tid) if e.type == "report_submitted"] == [
        "REVIEWER read Spec draft: no findings"]


def test_a_role_package_is_held_to_the_delegation_its_assign_scope_declares(sqlite_db: Database) -> None:
    """Delegation is read from what the role module declares, built-in or installed: a package role with every
    command and ``assign_scope`` anyone still never judges work it drives; one reaching only the leader names
    no peer as judge."""
    roles = {"ADMIN": builtin.admin(), "PM": builtin.leader("PM"), "DEV": builtin.worker("DEV"),
             "LEAD": RoleSpec("LEAD", ALL_COMMANDS, AssignScope.ANYONE, "a package's own lead"),
             "SCOUT": RoleSpec("SCOUT", builtin.WORKER_COMMANDS, AssignScope.LEADER, "reports upwards")}
    sqlite_db.create_schema(metadata)
    kernel = TaskCommandKernel(sqlite_db, RoleRegistry("PM", roles))

    def create(role: str, key: str, **payload: str) -> tuple[str, str]:
        r = kernel.submit({"type": "create_task", "idempotency_key": key,
                           "payload": {"sender": role, "subject": "s", **payload}}, Principal(role, "agent"))
        return r.status, r.message

    status, message = create("LEAD", "self", recipient="LEAD")
    assert status == "rejected" and "nobody judges its own work" in message
    assert create("LEAD", "judged", recipient="LEAD", done_authority="PM")[0] == "accepted"
    status, message = create("SCOUT", "peer", recipient="PM", done_authority="DEV")
    assert status == "rejected" and message.endswith("it may name SCOUT, PM or ADMIN"), message
    assert create("SCOUT", "upwards", recipient="PM", done_authority="ADMIN")[0] == "accepted"
    # a judge must be a role whose module may approve: SCOUT (by default, the sender) may not
    status, message = create("SCOUT", "undecided", recipient="PM")
    assert status == "rejected" and message.endswith("name a done_authority that may: ADMIN or LEAD"), message
