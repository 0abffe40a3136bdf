"""Role modules: built-in presets, least privilege for unknown roles, installed third-party packages."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskkernel.kernel.model.commands import CommandType
from taskkernel.roles.protocol import AssignScope
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
