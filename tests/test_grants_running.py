"""Grants follow acceptance order while agents run (issue 28, item 5; seed 000's orders O0–O6).

Real processes throughout: a `taskkernel up --once` coordinator runs DEV's task with a stand-in agent
(tests/procs/gated_agent.py) that reaches the kernel through the MCP server its run is configured with, on the run's
task-scoped token. While that one run is in progress, the test changes the grants as ADMIN from other processes
(`taskkernel session accept`, `taskkernel session import`), then opens a barrier; only then does the agent ask
`check_action` and `perform` for a protected write (`write` on `file:reports/gated.txt`, content naming the case, so
each step is a new action with its own idempotency key). Each answer must be the acceptance order's at that moment:
not the storage order (which an import can make differ from it), and not what the same agent was told a step earlier.

Storage order differs from acceptance order only through an import (line order is storage order). Its lines for new
inputs are signed with the workspace's export key, as an export from a workspace sharing `chain.key` would be
(docs/sessionlog.md, "Ownership and signed export"): unsigned, the grants would count as `IMPORTED:` (an agent's)
and every order would be refused alike, which would test nothing about order.

The cases are named as in the issue: O0 nothing; O1 allow then revoke, stored revoke first; O2 allow then revoke,
stored in order; O3 revoke then allow (here stored allow first); O4 allow only; O5 a missing sequence; O6 a
duplicate sequence. (docs/sessionlog.md's table numbers some of the same orders differently.)
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from taskkernel.coordinator.workspace import Workspace
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.private import read_secret
from taskkernel.kernel.sessionlog import Rec, parse_lines, replay
from taskkernel.kernel.sessionlog.interchange import signing_key, to_line
from tests.cli_support import CLI, cli_env, taskkernel
from tests.coord_support import make_workspace

GATED_AGENT = Path(__file__).parent / "procs" / "gated_agent.py"
SESSION = "admin"  # the gate's session ([gate] session's default)
PERMISSION, SCOPE = "write", "file:reports/gated.txt"  # the one permission and scope every case is about
WAIT_S = 60.0


class RunningAgent:
    """A workspace whose DEV task is being worked by the gated agent under `taskkernel up --once`; the test is ADMIN
    (the workspace's local owner) in separate CLI processes."""

    def __init__(self, tmp: Path) -> None:
        self.gates = tmp / "gates"
        self.gates.mkdir()
        self.ws: Workspace = make_workspace(tmp / "ws", {"DEV": {
            "runner": "command", "argv": [sys.executable, str(GATED_AGENT), "{mcp_config}", "{task_id}",
                                          str(self.gates)],
            "max_attempts": 1, "timeout": 300}})
        self.root = self.ws.root
        self.out, self.err = tmp / "up.out", tmp / "up.err"
        self.up: subprocess.Popen[bytes] | None = None
        self.step = self.imports = 0
        # The basis every planned write cites: ADMIN's instruction about the file (sequence 1).
        self.ok("session", "accept", SESSION, "--kind", "message", "--input-id", "m1", "--payload",
                json.dumps({"text": "Write the gated report", "entity": SCOPE}))
        made = self.ok("task", "create", "--to", "DEV", "--subject", "Gated reports", "--risk", "medium",
                       "--body", "write the reports when told")
        self.task_id = str(made["task_id"])

    # --- ADMIN, in other processes ---------------------------------------------------------------------------------
    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return taskkernel(*args, cwd=self.root)

    def ok(self, *args: str) -> Any:
        done = self.cli(*args, "--json")
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout.strip().splitlines()[-1])

    def accept(self, kind: str, input_id: str) -> int:
        payload = json.dumps({"permission": PERMISSION, "scope": SCOPE})
        out = self.ok("session", "accept", SESSION, "--kind", kind, "--input-id", input_id, "--payload", payload)
        assert out["status"] == "accepted", out
        return int(out["accept_seq"])

    def export(self) -> list[str]:
        done = self.cli("session", "export", SESSION)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stdout.splitlines() if line.strip()]

    def signed(self, input_id: str, kind: str, seq: int) -> str:
        """A new grant input as an export of a workspace holding this one's chain key writes it."""
        key = signing_key(read_secret(self.ws.chain_key_path))
        rec = Rec(seq, input_id, kind, {"permission": PERMISSION, "scope": SCOPE}, accepted_by=LOCAL_OWNER.id)
        return to_line(SESSION, rec, key)

    def import_lines(self, lines: list[str]) -> subprocess.CompletedProcess[str]:
        self.imports += 1
        path = self.gates.parent / f"import-{self.imports}.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return self.cli("session", "import", str(path), "--json")

    # --- the running agent -----------------------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        with open(self.out, "wb") as out, open(self.err, "wb") as err:  # files, not pipes: its log never blocks it
            self.up = subprocess.Popen([*CLI, "up", str(self.root), "--once"], cwd=self.root, env=cli_env(),
                                       stdout=out, stderr=err)
        return self._wait(self.gates / "ready.json")

    def act(self, case: str, grant: str | None) -> dict[str, Any]:
        """Open the next barrier: the agent plans to write `written at <case>` to reports/gated.txt citing `grant`,
        asks `check_action`, then `perform`; its two answers."""
        self.step += 1
        action: dict[str, Any] = {"operation": PERMISSION, "entity": SCOPE, "tool": "write_file",
                                  "args": {"path": "reports/gated.txt", "content": f"written at {case}"},
                                  "based_on_event": "m1"}
        if grant is not None:
            action["permission_event"] = grant
        self._open(self.step, {"action": action})
        return self._wait(self.gates / f"answer-{self.step}.json")

    def finish(self) -> None:
        """Let the agent report and exit; `up --once` then finishes (performing the authorized writes)."""
        self.step += 1
        self._open(self.step, {"finish": True})
        assert self.up is not None
        code = self.up.wait(timeout=WAIT_S)
        assert code == 0, self._logs()

    def stop(self) -> None:
        """After a failure: SIGTERM makes `up --once` stop its running agent's process group, then exit."""
        if self.up is not None and self.up.poll() is None:
            self.up.terminate()
            try:
                self.up.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.up.kill()
                self.up.wait()

    def _open(self, step: int, doc: dict[str, Any]) -> None:
        tmp = self.gates / f"go-{step}.tmp"
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, self.gates / f"go-{step}.json")

    def _wait(self, path: Path) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        while not path.exists():
            assert self.up is not None
            assert self.up.poll() is None, f"up ended before {path.name}: {self._logs()}"
            assert time.monotonic() < deadline, f"no {path.name} within {WAIT_S} s: {self._logs()}"
            time.sleep(0.02)
        return dict(json.loads(path.read_text(encoding="utf-8")))

    def _logs(self) -> str:
        tails = [p.read_text(errors="replace")[-3000:] for p in (self.out, self.err) if p.exists()]
        runs = sorted((self.root / ".taskkernel" / "runs").glob("*/attempt-*/std*.log"))
        tails += [f"{p}: {p.read_text(errors='replace')[-2000:]}" for p in runs]
        return "\n".join(tails)

    def written(self) -> str | None:
        """What the coordinator's authorized writes left in reports/gated.txt."""
        path = self.root / "workspace" / "reports" / "gated.txt"
        return path.read_text(encoding="utf-8") if path.exists() else None

    def verdicts(self) -> list[str]:
        """The gate's recorded verdicts on the agent's `perform`s, in order (`check_action` records none)."""
        db = sqlite3.connect(self.root / ".taskkernel" / "kernel.db")
        try:
            rows = db.execute("SELECT data FROM events WHERE stream_id = ? ORDER BY global_pos",
                              (f"gate:{self.task_id}",)).fetchall()
        finally:
            db.close()
        return [json.loads(data)["status"] for (data,) in rows]


@pytest.fixture
def agent(tmp_path: Path) -> Any:
    running = RunningAgent(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def allowed(answer: dict[str, Any]) -> None:
    performed, checked = answer["perform"], answer["check_action"]
    assert not performed["is_error"] and performed["structured"]["status"] == "accepted", answer
    assert not checked["is_error"] and checked["structured"]["allowed"] is True, answer
    assert checked["structured"]["verdict"]["status"] == "PASS", answer


def refused(answer: dict[str, Any], reason: str, code: str, by: str | None = None) -> None:
    """`perform` refused with the kernel's reason and the gate's first reason code (and the input that decided it);
    `check_action`, asked just before, gives the same verdict."""
    performed, checked = answer["perform"], answer["check_action"]
    doc = performed["structured"]
    assert performed["is_error"] and doc["status"] == "rejected", answer
    assert doc["reason"] == reason and code in doc["message"], answer
    first = checked["structured"]["verdict"]["reasons"][0]
    assert checked["structured"]["allowed"] is False and first["code"] == code, answer
    if by is not None:
        assert first["by"] == by, answer


def decisions(lines: list[str]) -> tuple[str, str]:
    """The decision on (write, file:reports/gated.txt) a reader of storage order reaches, and acceptance order's."""
    records = parse_lines(lines)[SESSION]

    def decide(order: str) -> str:
        result = replay(records, order=order, reducer="permission")
        return str(result.state[(PERMISSION, SCOPE)][0]) if result.known else f"unknown: {result.reason}"

    return decide("record"), decide("acceptance")


def ids_in_storage_order(lines: list[str]) -> list[str]:
    return [json.loads(line)["input_id"] for line in lines]


def test_each_next_gated_action_of_a_running_agent_follows_acceptance_order(agent: RunningAgent) -> None:
    """One agent run, one grant scope, seed 000's orders applied in turn while the agent runs. After each grant
    change its very next `perform` is judged by the acceptance order at that moment: refused after an allow→revoke
    stored revoke-first (storage says allow) although the same agent was allowed one step before; allowed after a
    revoke→allow stored allow-first (storage says deny); and an import with a gap or a duplicate sequence is
    refused whole, so the grant it carried never reaches the agent."""
    who = agent.start()["structured"]["principal"]
    assert (who["role"], who["task_id"]) == ("DEV", agent.task_id), who  # the run's task-scoped token

    # O0: nothing granted: the protected write lacks a permission (fail closed).
    refused(agent.act("O0", None), "gate_insufficient_evidence", "MISSING_PERMISSION")

    # O4: an allow only.
    assert agent.accept("allow", "g1") == 2
    allowed(agent.act("O4", "g1"))

    # O1: a new allow (seq 3) then its revoke (seq 4), imported with the revoke stored first.
    base = agent.export()
    done = agent.import_lines([*base, agent.signed("r1", "revoke", 4), agent.signed("g2", "allow", 3)])
    assert done.returncode == 0, (done.stdout, done.stderr)
    stored = agent.export()
    assert ids_in_storage_order(stored)[-2:] == ["r1", "g2"], "the revoke is stored before the allow"
    assert decisions(stored) == ("allow", "deny")
    refused(agent.act("O1", "g2"), "gate_blocked", "PERMISSION_NOT_CURRENT", by="r1")

    # O3: a revoke (seq 5) then a new allow (seq 6), imported with the allow stored first.
    done = agent.import_lines([*stored, agent.signed("g3", "allow", 6), agent.signed("r2", "revoke", 5)])
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert decisions([*stored, agent.signed("g3", "allow", 6), agent.signed("r2", "revoke", 5)]) == ("deny", "allow")
    allowed(agent.act("O3", "g3"))

    # O2: allow (above) then revoke, stored in order: the agent allowed one step ago is refused now.
    assert agent.accept("revoke", "r3") == 7
    refused(agent.act("O2", "g3"), "gate_blocked", "PERMISSION_NOT_CURRENT", by="r3")
    stored = agent.export()
    assert ids_in_storage_order(stored)[-3:] == ["g3", "r2", "r3"], "O3's allow was stored before its revoke"

    # O5 and O6: an import whose log is damaged is refused whole; the allow it carried never authorizes.
    for case, grant, extra, reason in (
            ("O5", "g4", [agent.signed("g4", "allow", 9)], "missing_sequence"),            # no sequence 8
            ("O6", "g5", [agent.signed("r4", "revoke", 8), agent.signed("g5", "allow", 8)], "duplicate_sequence")):
        assert decisions([*stored, *extra]) == ("allow", f"unknown: {reason}"), "a storage-order reader allows"
        done = agent.import_lines([*stored, *extra])
        assert done.returncode == 2 and json.loads(done.stdout)["reason"] == reason, (done.stdout, done.stderr)
        refused(agent.act(case, grant), "gate_insufficient_evidence", "UNKNOWN_EVENT")
    assert agent.export() == stored, "nothing of either refused file was stored"

    agent.finish()
    assert agent.verdicts() == ["INSUFFICIENT_EVIDENCE", "PASS", "BLOCK", "PASS", "BLOCK", "INSUFFICIENT_EVIDENCE",
                                "INSUFFICIENT_EVIDENCE"]
    assert agent.written() == "written at O3", "the last write performed is the last one allowed"


def test_a_grant_log_damaged_while_the_agent_runs_fails_closed(agent: RunningAgent) -> None:
    """A gap cannot be imported, and the database's unique (session, seq) index cannot hold a duplicate; what is left
    is damage outside the kernel: the revoke ADMIN was acknowledged is lost from the database (a bad restore, a hand
    edit, corruption) while the counter still says it was accepted. The session log then replays as
    `missing_sequence`, and the running agent's next gated action must be refused, not judged by the grant that
    happens to be left."""
    agent.start()
    assert agent.accept("allow", "g1") == 2
    allowed(agent.act("O4", "g1"))
    assert agent.accept("revoke", "r1") == 3
    db = sqlite3.connect(agent.root / ".taskkernel" / "kernel.db")
    try:
        with db:
            lost = db.execute("DELETE FROM session_input WHERE session_id = ? AND input_id = 'r1'", (SESSION,))
            assert lost.rowcount == 1
    finally:
        db.close()
    damaged = agent.cli("session", "replay", SESSION, "--reducer", "permission", "--json")
    assert damaged.returncode == 2 and json.loads(damaged.stdout)["reason"] == "missing_sequence", damaged.stdout
    answer = agent.act("after", "g1")
    performed = answer["perform"]
    assert performed["is_error"] and performed["structured"]["status"] == "rejected", answer
    assert "missing_sequence" in performed["structured"]["message"], answer
    checked = answer["check_action"]["structured"]  # check_action judges as perform does: nothing can be judged
    assert checked["reason"] == "gate_insufficient_evidence" and "missing_sequence" in checked["message"], answer
    agent.finish()
    assert agent.written() == "written at O4", "the write the lost revoke forbade was not performed"
