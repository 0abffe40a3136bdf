"""No path from an agent's credential to ADMIN: every state-changing verb checks the caller's credential.

The attacker is another process holding a DEV (or a run's task-scoped) token; everything goes through the
real CLI. Only the cases where the store matters run on SQLite and PostgreSQL (credentials, per-principal
idempotency receipts and replays, the chain key): the others are decided above the store, by the same code on
either, so they run once, on SQLite (``above_the_store``), and say which store-level test covers what they read.
"""

from __future__ import annotations

import json
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import Run, taskkernel

BOGUS = "tk_" + "x" * 43
# the `ws` fixture on SQLite only: for checks the CLI and kernel decide above the store, which both backends
# serve through the same statements (kernel/store/db.py only swaps placeholders)
above_the_store = pytest.mark.parametrize("any_url", ["sqlite"], indirect=True)


class Ws:
    """A workspace driven through the CLI; ``as_(token)`` runs a command with that credential."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def run(self, *args: str, token: str | None = None, stdin: str | None = None,
            env: dict[str, str] | None = None) -> Run:
        extra = dict(env or {})
        if token is not None:
            extra["TASKKERNEL_TOKEN"] = token
        p = taskkernel(*args, cwd=self.root, stdin=stdin, env=extra)
        return Run(p.returncode, p.stdout, p.stderr)

    def token(self, role: str, *extra: str) -> str:
        r = self.run("token", "issue", role, *extra)
        assert r.code == 0, r
        return r.out.strip()

    def submit(self, command: dict[str, Any], token: str | None = None) -> Run:
        return self.run("submit", "-", token=token, stdin=json.dumps(command))

    def on(self, kind: str, task_id: str, key: str, token: str | None = None, **payload: Any) -> Run:
        doc = self.run("task", "show", task_id).json
        return self.submit({"type": kind, "task_id": task_id, "thread_key": doc["thread_key"],
                            "expected_revision": doc["revision"], "round": doc["round"],
                            "idempotency_key": key, "payload": payload}, token)


@pytest.fixture
def ws(any_url: str, tmp_path: Path) -> Ws:
    root = tmp_path / "ws"
    assert taskkernel("--db", any_url, "init", str(root), cwd=tmp_path).returncode == 0
    assert f"database = {json.dumps(any_url)}" in (root / "taskkernel.toml").read_text()  # found without --db
    return Ws(root)


def rejected(r: Run, reason: str) -> None:
    assert r.code == 2, r
    assert r.json["reason"] == reason, r
    assert "Traceback" not in r.err


def high_risk_branch_in_review(ws: Ws) -> tuple[str, str]:
    """ADMIN -> PM root; PM -> DEV child with risk high, done and submitted: PM's approval needs a grant."""
    pm, dev = ws.token("PM"), ws.token("DEV")
    root = ws.submit({"type": "create_task", "idempotency_key": "root",
                      "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "ship"}}).json["task_id"]
    assert ws.on("claim", root, "pm-claim", pm).code == 0
    child = ws.submit({"type": "create_task", "idempotency_key": "child", "payload": {
        "sender": "PM", "recipient": "DEV", "subject": "deploy", "parent": root, "risk_level": "high"}},
        pm).json["task_id"]
    assert ws.on("claim", child, "dev-claim", dev).code == 0
    assert ws.on("submit_report", child, "dev-report", dev, status="done", body="ok").code == 0
    assert ws.on("submit", child, "dev-submit", dev).code == 0
    return child, pm


@above_the_store  # grants read from the session log on both stores: test_permissions.py
def test_forged_import_gives_no_grant(ws: Ws, tmp_path: Path) -> None:
    child, pm = high_risk_branch_in_review(ws)
    dev = ws.token("DEV")
    forged = tmp_path / "forged.jsonl"
    forged.write_text(json.dumps({"session": "admin", "input_id": "g1", "kind": "allow", "accept_seq": 1,
                                  "accepted_by": "ADMIN:local-owner",
                                  "payload": {"permission": "approve", "scope": f"task:{child}"}}) + "\n")
    rejected(ws.run("session", "import", str(forged), token=dev), "role_not_authorized")
    rejected(ws.run("session", "import", str(forged), token=BOGUS), "actor_unverified")
    rejected(ws.on("approve", child, "pm-approve", pm), "permission_required")
    # even the owner importing an unsigned file gets no grant out of it: the claim is kept, marked
    assert ws.run("session", "import", str(forged)).code == 0
    exported = [json.loads(x) for x in ws.run("session", "export", "admin").out.splitlines()]
    assert [x["accepted_by"] for x in exported] == ["IMPORTED:ADMIN:local-owner"]
    rejected(ws.on("approve", child, "pm-approve-2", pm), "permission_required")
    assert ws.run("verify").code == 0
    # a grant the owner really gave works (and a DEV cannot revoke it)
    grant = ws.run("session", "accept", "admin", "--kind", "allow", "--input-id", "g2", "--payload",
                   json.dumps({"permission": "approve", "scope": f"task:{child}"}))
    assert grant.code == 0, grant
    rejected(ws.run("session", "accept", "admin", "--kind", "revoke", "--input-id", "r1", "--payload",
                    json.dumps({"permission": "approve", "scope": f"task:{child}"}), token=ws.token("DEV")),
             "role_not_authorized")
    assert ws.on("approve", child, "pm-approve-3", pm).json["status"] == "accepted"


@above_the_store  # signing is above the store; export/import on both stores: test_sessionlog_accept.py
def test_signed_export_keeps_provenance_and_a_tampered_line_loses_it(ws: Ws, tmp_path: Path) -> None:
    for i, kind in enumerate(("message", "allow")):
        payload = {"text": "go"} if kind == "message" else {"permission": "approve", "scope": "task:TASK-20260101-001"}
        assert ws.run("session", "accept", "s1", "--kind", kind, "--input-id", f"i{i}",
                      "--payload", json.dumps(payload)).code == 0
    lines = [json.loads(x) for x in ws.run("session", "export", "s1").out.splitlines()]
    assert all(len(x["sig"]) == 64 for x in lines)
    for x in lines:
        x["session"] = "s2"  # the signature covers the session too: moving a line is tampering
    moved = tmp_path / "moved.jsonl"
    moved.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert ws.run("session", "import", str(moved)).code == 0
    assert {x["accepted_by"] for x in map(json.loads, ws.run("session", "export", "s2").out.splitlines())} == {
        "IMPORTED:ADMIN:local-owner"}
    lines = [json.loads(x) for x in ws.run("session", "export", "s1").out.splitlines()]
    for x in lines:
        x["session"] = "s3"
    signed = tmp_path / "signed.jsonl"
    signed.write_text("".join(json.dumps({k: v for k, v in x.items() if k != "sig"}) + "\n" for x in lines))
    assert ws.run("session", "import", str(signed)).code == 0  # unsigned: claims marked
    assert {x["accepted_by"] for x in map(json.loads, ws.run("session", "export", "s3").out.splitlines())} == {
        "IMPORTED:ADMIN:local-owner"}
    genuine = tmp_path / "genuine.jsonl"
    genuine.write_text(ws.run("session", "export", "s1").out)
    fresh = Ws(tmp_path / "other")
    assert taskkernel("init", str(fresh.root), cwd=tmp_path).returncode == 0
    (fresh.root / ".taskkernel" / "chain.key").unlink(missing_ok=True)
    (fresh.root / ".taskkernel" / "chain.key").write_bytes((ws.root / ".taskkernel" / "chain.key").read_bytes())
    assert fresh.run("session", "import", str(genuine)).code == 0  # same workspace key: provenance proven
    assert [x["accepted_by"] for x in map(json.loads, fresh.run("session", "export", "s1").out.splitlines())] == [
        "ADMIN:local-owner", "ADMIN:local-owner"]


@above_the_store  # who may write a session is the CLI's check; sessions on both stores: test_sessionlog_accept.py
def test_agents_write_only_their_own_sessions(ws: Ws) -> None:
    dev, pm = ws.token("DEV"), ws.token("PM")
    msg = json.dumps({"text": "hello"})
    assert ws.run("session", "accept", "dev-notes", "--kind", "message", "--input-id", "m1", "--payload", msg,
                  token=dev).code == 0
    rejected(ws.run("session", "accept", "dev-notes", "--kind", "message", "--input-id", "m2", "--payload", msg,
                    token=pm), "role_not_authorized")
    rejected(ws.run("session", "consume", "dev-notes", "--through", "1", token=pm), "role_not_authorized")
    rejected(ws.run("session", "complete-turn", "dev-notes", token=pm), "role_not_authorized")
    rejected(ws.run("session", "export", "dev-notes", token=pm), "role_not_authorized")
    rejected(ws.run("session", "replay", "dev-notes", token=pm), "role_not_authorized")
    assert ws.run("session", "consume", "dev-notes", "--through", "1", token=dev).code == 0
    assert ws.run("session", "export", "dev-notes").code == 0  # ADMIN reads every session
    # the grant session: instructions, bookkeeping and grants are ADMIN's; evidence is anyone's, weighed by role
    for kind, payload in (("message", msg), ("allow", json.dumps({"permission": "approve", "scope": "task:X"}))):
        rejected(ws.run("session", "accept", "admin", "--kind", kind, "--input-id", f"x-{kind}", "--payload", payload,
                        token=dev), "role_not_authorized")
    rejected(ws.run("session", "refuse", "admin", "--kind", "message", "--input-id", "x", "--reason", "r",
                    "--payload", msg, token=dev), "role_not_authorized")
    rejected(ws.run("session", "accept", "mine", "--kind", "allow", "--input-id", "g", "--payload",
                    json.dumps({"permission": "approve", "scope": "task:X"}), token=dev), "role_not_authorized")
    obs = {"tool": "get_env", "status": "ok", "entity": "env:current", "key": "name", "value": "prod"}
    assert ws.run("session", "accept", "admin", "--kind", "observation", "--input-id", "o1", "--payload",
                  json.dumps(obs), token=dev).code == 0
    exported = [json.loads(x) for x in ws.run("session", "export", "admin").out.splitlines()]
    assert exported[-1]["accepted_by"] == "DEV:dev"  # an agent's claim, never a tool's read


@above_the_store  # an unknown token is one lookup, on both stores in test_dev_cannot_mint_or_act_as_admin
def test_bogus_and_empty_tokens_are_refused_everywhere(ws: Ws) -> None:
    tid = ws.submit({"type": "create_task", "idempotency_key": "t",
                     "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "s"}}).json["task_id"]
    goal = ws.run("goal", "start", tid).json["goal_id"]
    verbs: list[tuple[str, ...]] = [
        ("token", "issue", "ADMIN"), ("submit", "-"),
        ("session", "accept", "s", "--kind", "message", "--input-id", "i", "--payload", '{"text":"x"}'),
        ("session", "refuse", "s", "--kind", "message", "--input-id", "i", "--reason", "r"),
        ("session", "consume", "s", "--through", "0"), ("session", "complete-turn", "s"),
        ("session", "import", "-"), ("session", "export", "admin"), ("goal", "start", tid), ("goal", "cancel", goal),
        ("task", "show", tid), ("task", "list"), ("log",), ("verify",)]  # a credential given must be live, reads too
    create = json.dumps({"type": "create_task", "idempotency_key": "b",
                         "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "s"}})
    # every verb with a well-formed but unknown token; the empty and malformed ones on a few (same code path)
    attempts = [(BOGUS, verb) for verb in verbs] + [(token, verb) for token in ("", "not-a-token")
                                                    for verb in verbs[:3]]
    with ThreadPoolExecutor(4) as pool:  # separate processes, run side by side
        results = list(pool.map(lambda a: ws.run(*a[1], token=a[0], stdin=create if a[1][0] == "submit" else ""),
                                attempts))
    for (token, verb), r in zip(attempts, results, strict=True):
        assert r.code == 2 and r.json["reason"] == "actor_unverified", (token, verb, r)
        assert "Traceback" not in r.err
    assert ws.run("task", "show", tid).json["revision"] == 1
    assert ws.run("goal", "show", goal).json["state"] == "active"


@above_the_store  # file modes and the owner's token file, no store involved
def test_no_token_means_the_owners_file_or_nothing(ws: Ws) -> None:
    state = ws.root / ".taskkernel"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for name in ("owner.token",):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600
    assert stat.S_IMODE((ws.root / "taskkernel.toml").stat().st_mode) == 0o600
    assert ws.run("token", "issue", "DEV").code == 0
    (state / "owner.token").rename(state / "elsewhere")
    r = ws.run("token", "issue", "ADMIN")
    rejected(r, "actor_unverified")
    assert "owner.token" in r.json["message"]
    owner = (state / "elsewhere").read_text().strip()
    assert ws.run("token", "issue", "DEV", token=owner).code == 0


# both stores: issued credentials are stored and looked up
def test_dev_cannot_mint_or_act_as_admin(ws: Ws) -> None:
    dev = ws.token("DEV")
    rejected(ws.run("token", "issue", "ADMIN", token=dev), "role_not_authorized")
    r = ws.submit({"type": "create_task", "idempotency_key": "k",
                   "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "s"}}, dev)
    rejected(r, "actor_unverified")
    tid = ws.submit({"type": "create_task", "idempotency_key": "t",
                     "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "s"}}).json["task_id"]
    rejected(ws.run("goal", "start", tid, token=dev), "role_not_authorized")
    scoped_admin = ws.token("ADMIN", "--task", tid)
    rejected(ws.run("goal", "start", tid, token=scoped_admin), "role_not_authorized")
    goal = ws.run("goal", "start", tid).json["goal_id"]
    rejected(ws.run("goal", "cancel", goal, token=dev), "role_not_authorized")
    assert ws.run("goal", "cancel", goal).json["state"] == "cancelled"


# both stores: per-principal keys are the receipts table's primary key
def test_idempotency_keys_cannot_be_squatted(ws: Ws) -> None:
    dev = ws.token("DEV")
    pm_task = ws.submit({"type": "create_task", "idempotency_key": "root",
                         "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "s"}}).json["task_id"]
    for prefix in ("file:", "schedule:", "run:", "dispatch:", "blocked:"):
        r = ws.submit({"type": "create_task", "idempotency_key": f"{prefix}fcop/_lifecycle/inbox/x.md:abc",
                       "payload": {"sender": "DEV", "recipient": "QA", "subject": "squat"}}, dev)
        rejected(r, "invalid_command")
        assert "reserved" in r.json["message"]
    # the same free-form key by two principals is two commands: PM cannot occupy the owner's next key
    assert ws.on("claim", pm_task, "next", ws.token("PM")).json["status"] == "accepted"
    r = ws.submit({"type": "create_task", "idempotency_key": "next",
                   "payload": {"sender": "ADMIN", "recipient": "PM", "subject": "owner's", "parent": pm_task}})
    assert r.json["status"] == "accepted", r
    assert ws.run("task", "show", r.json["task_id"]).json["subject"] == "owner's"


@above_the_store  # scope is checked on the verified credential, above the store
def test_a_task_scoped_admin_token_has_no_admin_power(ws: Ws) -> None:
    tid = ws.submit({"type": "create_task", "idempotency_key": "t", "payload": {
        "sender": "ADMIN", "recipient": "PM", "subject": "s", "risk_level": "high"}}).json["task_id"]
    scoped = ws.token("ADMIN", "--task", tid, "--round", "0")
    rejected(ws.on("amend", tid, "lower", scoped, risk_level="low"), "role_not_authorized")
    rejected(ws.run("token", "issue", "DEV", token=scoped), "role_not_authorized")
    rejected(ws.run("session", "accept", "admin", "--kind", "message", "--input-id", "m", "--payload",
                    '{"text":"deploy"}', token=scoped), "role_not_authorized")
    # in its own session it writes as a run, which the gate never takes for the owner's word
    assert ws.run("session", "accept", "mine", "--kind", "message", "--input-id", "m", "--payload",
                  '{"text":"deploy"}', token=scoped).code == 0
    [line] = [json.loads(x) for x in ws.run("session", "export", "mine").out.splitlines()]
    assert line["accepted_by"] == f"RUN:ADMIN:admin@{tid}"


@above_the_store  # session ownership is the CLI's check
def test_run_tokens_of_one_role_do_not_share_sessions(ws: Ws) -> None:
    ids = [ws.submit({"type": "create_task", "idempotency_key": f"t{i}", "payload": {
        "sender": "ADMIN", "recipient": "DEV", "subject": f"s{i}"}}).json["task_id"] for i in range(2)]
    run_a, run_b = (ws.token("DEV", "--agent", "dev-agent", "--task", t, "--round", "0") for t in ids)
    secret = json.dumps({"text": "api key = hunter2"})
    assert ws.run("session", "accept", "task-a", "--kind", "message", "--input-id", "s1", "--payload", secret,
                  token=run_a).code == 0
    rejected(ws.run("session", "replay", "task-a", token=run_b), "role_not_authorized")
    rejected(ws.run("session", "accept", "task-a", "--kind", "message", "--input-id", "s2", "--payload", secret,
                    token=run_b), "role_not_authorized")
    assert ws.run("session", "replay", "task-a", token=run_a).code == 0


@above_the_store  # session ownership is the CLI's check
def test_a_session_named_after_a_principal_is_that_principals_own(ws: Ws) -> None:
    """The MCP server's default sessions are named after their owner (``QA:qa``, ``RUN:DEV:dev@TASK-…``):
    another agent writing first must not become their owner and lock the real one out."""
    task = ws.submit({"type": "create_task", "idempotency_key": "sq", "payload": {
        "sender": "ADMIN", "recipient": "DEV", "subject": "s"}}).json["task_id"]
    run = ws.token("DEV", "--task", task, "--round", "0")
    qa = ws.token("QA")
    note = json.dumps({"text": "mine now"})
    for target in ("QA:qa", f"RUN:DEV:dev@{task}-other"):
        rejected(ws.run("session", "accept", target, "--kind", "message", "--input-id", "squat", "--payload", note,
                        token=run), "role_not_authorized")
    assert ws.run("session", "accept", "QA:qa", "--kind", "message", "--input-id", "q1", "--payload", note,
                  token=qa).code == 0
    assert ws.run("session", "replay", "QA:qa", token=qa).code == 0


@above_the_store  # the refusal is the gate's, schedules on both stores: test_security_schedule.py
def test_a_configured_grant_session_is_admins_for_schedules_too(ws: Ws) -> None:
    config = ws.root / "taskkernel.toml"
    config.write_text(config.read_text() + '\n[gate]\nsession = "grants"\n')
    dev = ws.token("DEV")
    rejected(ws.run("session", "accept", "grants", "--kind", "message", "--input-id", "m", "--payload",
                    '{"text":"deploy now"}', token=dev), "role_not_authorized")
    added = ws.run("schedule", "add", "g", "--every", "1s", "--action", "accept_input", "--session", "grants",
                   "--kind", "message", "--payload", '{"text":"deploy now"}', token=dev)
    assert added.code == 0, added
    time.sleep(2.5)
    ws.run("up", "--once")
    lines = [json.loads(x) for x in ws.run("session", "export", "grants").out.splitlines()]
    assert not [x for x in lines if x.get("kind") == "message"], lines  # refused when it fired, as from the CLI


# both stores: the store signs its chain with that key
def test_a_missing_chain_key_is_never_silently_replaced(ws: Ws, tmp_path: Path) -> None:
    assert ws.run("session", "accept", "s", "--kind", "message", "--input-id", "i", "--payload",
                  '{"text":"x"}').code == 0
    key = ws.root / ".taskkernel" / "chain.key"
    key.rename(tmp_path / "kept.key")
    exported = ws.run("session", "export", "s")
    assert exported.code == 0 and "sig" not in exported.json  # readable, but nothing to sign with
    assert ws.run("session", "import", "-", stdin="").code == 0
    assert not key.exists()
    (tmp_path / "kept.key").rename(key)
    assert ws.run("verify").code == 0


@above_the_store  # a file write, no store involved
def test_export_never_writes_through_a_planted_link(ws: Ws, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (ws.root / "workspace" / "out.jsonl").symlink_to(victim)
    assert ws.run("session", "accept", "s", "--kind", "message", "--input-id", "i", "--payload",
                  '{"text":"x"}').code == 0
    r = ws.run("session", "export", "s", "-o", str(ws.root / "workspace" / "out.jsonl"))
    assert r.code == 65 and "Traceback" not in r.err, r
    assert victim.read_text() == "precious"


# both stores: a replay is read back from the receipts
def test_run_tokens_cannot_occupy_or_replay_another_tasks_keys(ws: Ws) -> None:
    ids = [ws.submit({"type": "create_task", "idempotency_key": f"t{i}", "payload": {
        "sender": "ADMIN", "recipient": "DEV", "subject": f"s{i}"}}).json["task_id"] for i in range(2)]
    run_a, run_b = (ws.token("DEV", "--agent", "dev-agent", "--task", t, "--round", "0") for t in ids)
    assert ws.on("claim", ids[0], "claim-round", run_a).json["status"] == "accepted"
    replay_a = {"type": "claim", "task_id": ids[0], "thread_key": ids[0], "expected_revision": 2, "round": 1,
                "idempotency_key": "claim-round", "payload": {}}
    rejected(ws.submit(replay_a, run_b), "role_not_authorized")  # never a replay of a task out of its scope
    # the same key from another task's run is that run's own command, not a conflict with task A's
    assert ws.on("claim", ids[1], "claim-round", run_b).json["status"] == "accepted"
    assert ws.submit(replay_a, run_a).json["status"] == "replayed"


# -- delegation: who a creator may name as driver, done and archive authority (kernel/delegation.py) ------------

def create(ws: Ws, key: str, token: str | None = None, **payload: str) -> Run:
    return ws.submit({"type": "create_task", "idempotency_key": key, "payload": {"subject": "s", **payload}}, token)


def authority(ws: Ws, r: Run) -> dict[str, str]:
    assert r.code == 0 and r.json["status"] == "accepted", r
    return dict(ws.run("task", "show", r.json["task_id"]).json["authority"])


def refused_naming(r: Run, *allowed: str) -> None:
    """Refused ``role_not_authorized``, the message naming the roles the creator may name instead."""
    rejected(r, "role_not_authorized")
    assert all(role in r.json["message"] for role in allowed), r.json["message"]


@above_the_store  # delegation (kernel/delegation.py) is decided before the store
def test_a_worker_cannot_make_itself_the_judge_of_its_own_work(ws: Ws) -> None:
    """The finding: DEV named itself driver and done authority of a task it created, to approve its own work.
    A worker gives work only upwards (the leader, ADMIN); it may keep the judging powers over work others do."""
    dev = ws.token("DEV")
    refused_naming(create(ws, "self", dev, sender="DEV", recipient="PM", driver="DEV", done_authority="DEV"),
                   "driver", "PM or ADMIN")
    refused_naming(create(ws, "lead-judges-itself", dev, sender="DEV", recipient="PM", done_authority="PM"),
                   "nobody judges its own work", "DEV or ADMIN")
    for field in ("done_authority", "archive_authority"):  # a peer it may not address is no judge it may name
        refused_naming(create(ws, f"peer-{field}", dev, sender="DEV", recipient="PM", **{field: "QA"}),
                       field, "DEV, PM or ADMIN")
    assert ws.run("task", "list").json == []  # a refusal writes nothing
    # within its delegation, but DEV (the requester, judge by default) may not approve: nobody could decide it
    refused_naming(create(ws, "ask-lead", dev, sender="DEV", recipient="PM"),
                   "done_authority DEV (by default, the sender) may not approve",
                   "name a done_authority that may: ADMIN")
    assert ws.run("task", "list").json == []
    assert authority(ws, create(ws, "ask-lead-admin-judges", dev, sender="DEV", recipient="PM",
                                done_authority="ADMIN", archive_authority="PM")) == {
        "driver": "PM", "done_authority": "ADMIN", "archive_authority": "PM"}


@above_the_store  # delegation is decided before the store
def test_the_lead_delegates_to_anyone_but_never_judges_what_it_drives_and_admin_sets_anything(ws: Ws) -> None:
    """The leader (assign_scope anyone) names any driver and judge but never one judge for its own driver; only the
    owner may make a driver its own judge."""
    pm = ws.token("PM")
    assert authority(ws, create(ws, "dev-admin", pm, sender="PM", recipient="DEV", done_authority="ADMIN")) == {
        "driver": "DEV", "done_authority": "ADMIN", "archive_authority": "PM"}
    # a judge that may not approve (a worker's role module) could never decide: refused at the door
    refused_naming(create(ws, "dev-qa", pm, sender="PM", recipient="DEV", done_authority="QA"),
                   "done_authority QA may not approve", "ADMIN or PM")
    assert authority(ws, create(ws, "dev-pm", pm, sender="PM", recipient="DEV")) == {
        "driver": "DEV", "done_authority": "PM", "archive_authority": "PM"}
    refused_naming(create(ws, "dev-self", pm, sender="PM", recipient="DEV", done_authority="DEV"),
                   "nobody judges its own work", "any role of the team but DEV")
    # the default done authority is the sender: a task the lead sends itself (here with the `task create` verb)
    # needs another judge, named explicitly
    own = ws.run("task", "create", "--to", "PM", "--subject", "mine", token=pm)
    refused_naming(own, "(by default, the sender)", "any role of the team but PM")
    assert authority(ws, create(ws, "pm-admin", pm, sender="PM", recipient="PM",
                                done_authority="ADMIN"))["driver"] == "PM"
    # the owner may set anything, even a driver that judges itself, as long as the judge may approve
    assert authority(ws, create(ws, "admin", None, sender="ADMIN", recipient="PM", driver="PM",
                                done_authority="PM", archive_authority="DEV")) == {
        "driver": "PM", "done_authority": "PM", "archive_authority": "DEV"}
    refused_naming(create(ws, "admin-dev", None, sender="ADMIN", recipient="DEV", done_authority="DEV"),
                   "done_authority DEV may not approve", "ADMIN or PM")


@above_the_store  # amend's fields are validated before the store
def test_amend_cannot_move_a_tasks_authority(ws: Ws) -> None:
    """Authority is fixed when the task is created, where delegation is judged: amend has no such fields."""
    pm = ws.token("PM")
    tid = create(ws, "t", pm, sender="PM", recipient="DEV").json["task_id"]
    for field, role in (("driver", "PM"), ("done_authority", "DEV"), ("archive_authority", "DEV")):
        rejected(ws.on("amend", tid, f"amend-{field}", pm, **{field: role}), "invalid_command")
    assert ws.run("task", "show", tid).json["authority"] == {
        "driver": "DEV", "done_authority": "PM", "archive_authority": "PM"}


@above_the_store  # the file reaches the same kernel check as the CLI
def test_a_task_file_gets_the_same_refusal(ws: Ws) -> None:
    """Every entry point submits through the kernel: a TASK file the lead addresses to itself is refused, with
    the reason beside it, and becomes no task."""
    assert ws.run("up", "--once").code == 0  # imports the (empty) workspace: later files are live input
    inbox = ws.root / "fcop" / "_lifecycle" / "inbox"
    name = "TASK-20261130-001-PM-to-PM.md"
    (inbox / name).write_text("---\nprotocol: fcop\nversion: 1\nsender: PM\nrecipient: PM\npriority: P2\n"
                              "subject: judge myself\n---\nbody\n", encoding="utf-8")
    assert ws.run("up", "--once").code == 0
    assert "role_not_authorized" in (inbox / f"_reason.{name}.txt").read_text(encoding="utf-8")
    assert ws.run("task", "list").json == []
