"""`taskkernel init` on a project that already holds an FCoP workspace, run as a user would.

Real agent-written G2 workspaces (shared/fixtures/fcop-field) are left byte for byte as they are, stay "v2" for
the fcop package, and the kernel then works with the team their fcop.json or their files name. A project
without a workspace still gets the G3 layout.
"""

from __future__ import annotations

import json
import os
import shutil
import tomllib
import warnings
from pathlib import Path

import pytest
from fcop.compatibility.v3.project import Project

from tests.cli_support import Run, run, taskkernel
from tests.fcop_oracle import snapshot

FIELD = {"fcop-d3e870a": "fcop", "docs-agents-0411ffc": "docs/agents", "docs-agents-353783a": "docs/agents",
         "repro/r1-g2-archive": "fcop", "repro/r2-dup-id": "fcop"}  # project -> its FCoP root
FILE_TEAMS = {"repro/r2-dup-id": ("PM", ["DEV", "PM"])}  # leader and roles of the file names; else ME alone
OUTSIDE = {"taskkernel.toml", ".taskkernel", "workspace"}  # all `init` adds to a project with a workspace


def field() -> Path:
    for candidate in (Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "fcop-field",
                      Path(os.environ.get("TASKKERNEL_FIXTURES", "/nonexistent")) / "fcop-field",
                      Path("/work/shared/fixtures/fcop-field")):
        if candidate.is_dir():
            return candidate
    raise AssertionError("fcop-field fixtures not found (shared/fixtures/fcop-field beside the repository)")


def copy_project(name: str, dest: Path) -> Path:
    """A writable copy of a field project (the fixtures are read-only)."""
    shutil.copytree(field() / name, dest)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    return dest


def topology(project: Path) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fcop warns that docs/agents is the 0.7-era location
        return str(Project(project).topology)


def init(root: Path, *args: str) -> Run:
    return run("init", str(root), *args, cwd=root.parent)


def submit(root: Path, token: str, command: dict[str, object]) -> dict[str, object]:
    r = taskkernel("submit", cwd=root, stdin=json.dumps(command), env={"TASKKERNEL_TOKEN": token})
    return dict(json.loads(r.stdout))


@pytest.mark.parametrize("keep_config", [True, False], ids=["as-found", "without-fcop-json"])
@pytest.mark.parametrize("name", FIELD)
def test_init_leaves_a_field_workspace_as_it_is(tmp_path: Path, name: str, keep_config: bool) -> None:
    root = copy_project(name, tmp_path / "project")
    fcop_root = root / FIELD[name]
    if not keep_config:
        (fcop_root / "fcop.json").unlink(missing_ok=True)
    has_config = (fcop_root / "fcop.json").exists()
    before, entries = snapshot(fcop_root), set(os.listdir(root))
    r = init(root)
    assert r.code == 0, r.out + r.err
    assert snapshot(fcop_root) == before, "nothing inside the FCoP root is added, changed or removed"
    assert set(os.listdir(root)) - entries == OUTSIDE, "no fcop/ beside docs/agents/, nothing else"
    assert topology(root) == "v2"
    out, config = r.json, tomllib.loads((root / "taskkernel.toml").read_text(encoding="utf-8"))
    assert (out["fcop_root"], out["fcop_created"]) == (str(fcop_root), False)
    if has_config:
        assert (out["team_source"], out["team"], out["leader"], out["roles"]) == ("fcop.json", "solo", "ME", ["ME"])
        assert "team" not in config
    else:
        leader, roles = FILE_TEAMS.get(name, ("ME", ["ME"]))
        assert (out["team_source"], out["leader"], out["roles"]) == ("files", leader, roles)
        assert (config["team"]["leader"], config["team"]["roles"]) == (leader, roles)
        assert f"from files: leader {leader}, roles {', '.join(roles)}" in r.err
    v = run("verify", cwd=root)
    assert v.code == 0, v.out + v.err
    assert snapshot(fcop_root) == before


def test_a_docs_agents_workspace_runs_under_up(tmp_path: Path) -> None:
    root = copy_project("docs-agents-0411ffc", tmp_path / "project")
    assert init(root).code == 0
    up = run("up", "--once", cwd=root)
    assert up.code == 0 and "ambiguous_workspace_root" not in up.out + up.err, up.out + up.err
    assert not (root / "fcop").exists()
    tasks = json.loads(run("task", "list", cwd=root).out)
    assert tasks and {t["recipient"] for t in tasks} == {"ME"}, "the coordinator read docs/agents/"


def g2_project(root: Path) -> Path:
    """A G2 workspace without fcop.json whose agents are a PLANNER and a CODER."""
    files = {"tasks/TASK-20260501-001-ADMIN-to-PLANNER.md": ("ADMIN", "PLANNER"),
             "tasks/TASK-20260501-002-PLANNER-to-CODER.md": ("PLANNER", "CODER"),
             "reports/REPORT-20260501-002-CODER-to-PLANNER.md": ("CODER", "PLANNER"),
             "log/tasks/TASK-20260430-001-ADMIN-to-PLANNER.md": ("ADMIN", "PLANNER")}
    for rel, (sender, recipient) in files.items():
        path = root / "fcop" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"---\nprotocol: fcop\nversion: 1\nsender: {sender}\nrecipient: {recipient}\n"
                        "priority: P2\nsubject: Work\n---\nDo it.\n", encoding="utf-8")
    return root


def create(sender: str, recipient: str, key: str) -> dict[str, object]:
    return {"type": "create_task", "idempotency_key": key,
            "payload": {"sender": sender, "recipient": recipient, "subject": f"{sender} to {recipient}"}}


def test_the_roles_its_files_use_may_be_given_work(tmp_path: Path) -> None:
    root = g2_project(tmp_path / "project")
    r = init(root)
    assert (r.code, r.json["team_source"], r.json["leader"], r.json["roles"]) == (0, "files", "PLANNER",
                                                                                 ["CODER", "PLANNER"]), r.err
    planner = taskkernel("token", "issue", "PLANNER", cwd=root).stdout.strip()
    coder = taskkernel("token", "issue", "CODER", cwd=root).stdout.strip()
    task = submit(root, planner, create("PLANNER", "CODER", "p1"))
    assert task["status"] == "accepted", task
    claim = submit(root, coder, {"type": "claim", "task_id": task["task_id"], "thread_key": task["task_id"],
                                 "expected_revision": 1, "round": 0, "idempotency_key": "c1", "payload": {}})
    assert claim["status"] == "accepted", claim
    asked = create("CODER", "PLANNER", "c2")
    refused = submit(root, coder, asked)  # by default CODER would judge it, and a worker may not approve
    assert refused["reason"] == "role_not_authorized" and "ADMIN" in refused["message"], refused
    asked["payload"]["done_authority"] = "ADMIN"  # type: ignore[index]
    assert submit(root, coder, asked)["status"] == "accepted", "a worker asks its leader, a person decides"


def test_an_explicit_team_preset_still_wins(tmp_path: Path) -> None:
    root = g2_project(tmp_path / "project")
    r = init(root, "--team", "dev-team")
    assert (r.code, r.json["team_source"], r.json["team"], r.json["leader"]) == (0, "preset", "dev-team", "PM")
    assert tomllib.loads((root / "taskkernel.toml").read_text(encoding="utf-8"))["team"]["leader"] == "PM"
    planner = taskkernel("token", "issue", "PLANNER", cwd=root).stdout.strip()
    refused = submit(root, planner, create("PLANNER", "CODER", "p1"))
    assert refused["reason"] == "role_not_authorized", "PLANNER is no role of the dev-team preset"


def test_an_empty_project_still_gets_the_g3_layout(tmp_path: Path) -> None:
    root = tmp_path / "project"
    r = init(root)
    assert r.code == 0, r.err
    assert (r.json["fcop_created"], r.json["team_source"], r.json["team"]) == (True, "preset", "dev-team")
    for stage in ("inbox", "active", "review", "done", "archive"):
        assert (root / "fcop" / "_lifecycle" / stage).is_dir()
    assert json.loads((root / "fcop" / "fcop.json").read_text(encoding="utf-8"))["leader"] == "PM"
    before = snapshot(root / "fcop")
    again = init(root)
    assert (again.code, again.json["fcop_created"], again.json["team_source"]) == (0, False, "fcop.json")
    other = init(root, "--team", "solo")
    assert other.code == 64 and "fcop.json" in other.json["message"], other.out
    assert snapshot(root / "fcop") == before


def test_an_empty_docs_agents_folder_gets_the_layout_and_no_fcop_beside_it(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / "docs" / "agents").mkdir(parents=True)
    r = init(root)
    assert (r.code, r.json["fcop_root"], r.json["fcop_created"]) == (0, str(root / "docs" / "agents"), True)
    assert (root / "docs" / "agents" / "_lifecycle" / "inbox").is_dir() and not (root / "fcop").exists()
    assert topology(root) == "v3"


def test_both_roots_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / "fcop" / "tasks").mkdir(parents=True)
    (root / "docs" / "agents" / "tasks").mkdir(parents=True)
    r = init(root)
    assert (r.code, r.json["reason"]) == (2, "ambiguous_workspace_root"), r.out
    assert sorted(os.listdir(root)) == ["docs", "fcop"]
