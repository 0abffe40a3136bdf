"""Task verbs: one call per action for agents and people (the CLI's `task create|claim|report|…`, the MCP tools).

A verb reads what a caller would otherwise copy by hand from `task show` (the task's revision and round), builds
the command and hands it to TaskCommandKernel, which judges it exactly as any submitted command; the thread key
is left out, so the kernel reads it from the task. ``expect_rev`` / ``round`` turn the optimistic check on for a
caller that read the task itself: a task that moved since is then ``stale_task_revision`` / ``stale_round``.

**Default idempotency keys** (docs/cli.md, "Task verbs"). Without a key from the caller, the key is
``tk1:<verb>:<task or new>:r<round>:<h>`` where ``h`` is the first 32 hex digits of the SHA-256 of the canonical
JSON of (the caller's provenance, the verb, the task id, the round the verb acts in, the command's payload). So:

- the same verb with the same content, retried in the same round (a crash after the commit, a lost reply)
  replays the first result instead of acting twice;
- a different report in the same round, or the same report in a later round, is a new command;
- a verb that starts a round (claim, reject, reopen) finds the task one round on when it is retried: its
  key for the round before is used again when that key's receipt left the task exactly where it is now
  (same revision), so the retry replays; once anything else moved the task, it is a new command;
- an identical ``create`` by the same caller replays (one task, not two); pass a key to create a twin on purpose;
- a ``retry`` also hashes the task's revision: retried again after its run failed again (a blocked report moved
  the task on) it is a new command, a new run; sent again while the task is where the first put it (a double
  click, a lost reply) it replays.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from taskkernel.kernel.canonical import canonical_json, sha256_hex
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.commands import CommandResult, CommandType
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.model.task import STARTS_ROUND
from taskkernel.kernel.permissions import DEFAULT_SESSION, permission_scope
from taskkernel.kernel.reasons import ReasonCode

KEY_VERSION = "tk1"
VERB_COMMANDS: dict[str, CommandType] = {
    "claim": CommandType.CLAIM,
    "report": CommandType.SUBMIT_REPORT,
    "submit": CommandType.SUBMIT,
    "approve": CommandType.APPROVE,
    "reject": CommandType.REJECT,
    "reopen": CommandType.REOPEN,
    "archive": CommandType.ARCHIVE,
    "amend": CommandType.AMEND,
    "retry": CommandType.RETRY,
}


def derive_key(principal: Principal, verb: str, task_id: str | None, round_: int | None,
               payload: dict[str, Any]) -> str:
    """The default idempotency key of a verb (see the module docstring)."""
    digest = sha256_hex(canonical_json({"principal": principal.provenance, "verb": verb, "task_id": task_id,
                                        "round": round_, "payload": payload}))
    return f"{KEY_VERSION}:{verb}:{task_id or 'new'}:r{'-' if round_ is None else round_}:{digest[:32]}"


@dataclass(frozen=True)
class VerbOutcome:
    """The kernel's result, plus, for a refusal a person can lift, the command that lifts it."""

    result: CommandResult
    key: str
    hint: str | None = None

    def wire(self) -> dict[str, Any]:
        """`submit`'s JSON document, with ``hint`` when there is one."""
        return {**self.result.wire(), **({"hint": self.hint} if self.hint else {})}


class TaskVerbs:
    """Verbs over one kernel. Stateless: every call reads the task afresh."""

    def __init__(self, kernel: TaskCommandKernel, grant_session: str = DEFAULT_SESSION) -> None:
        self.kernel = kernel
        self.grant_session = grant_session

    def create(self, principal: Principal, payload: dict[str, Any], *, key: str | None = None) -> VerbOutcome:
        """A new task from the caller (``sender`` is the caller's role unless the payload names one)."""
        payload = {"sender": principal.role, **payload}
        key = key or derive_key(principal, "create", None, None, payload)
        result = self.kernel.submit({"type": CommandType.CREATE_TASK.value, "idempotency_key": key,
                                     "payload": payload}, principal, external=True)
        return VerbOutcome(result, key)

    def act(self, principal: Principal, verb: str, task_id: str, payload: dict[str, Any] | None = None, *,
            expect_rev: int | None = None, round_: int | None = None, key: str | None = None) -> VerbOutcome:
        """Run ``verb`` (a key of VERB_COMMANDS) on the task as it is now, or as the caller expects it."""
        command_type = VERB_COMMANDS[verb]
        payload = payload or {}
        doc = self.kernel.task(task_id)
        if doc is None:
            missing = CommandResult(status="rejected", reason=ReasonCode.TASK_NOT_FOUND.value,
                                    message=f"{task_id} does not exist", task_id=task_id)
            return VerbOutcome(missing, key or "")
        revision = doc["revision"] if expect_rev is None else expect_rev
        acting_round = doc["round"] if round_ is None else round_
        key = key or self._default_key(principal, verb, command_type, doc, acting_round, payload)
        result = self.kernel.submit({"type": command_type.value, "task_id": task_id, "expected_revision": revision,
                                     "round": acting_round, "idempotency_key": key, "payload": payload},
                                    principal, external=True)
        if result.status == "rejected" and result.revision is None:  # refused before the kernel read the task
            # (its shape, its credential): the caller still learns where the task stands
            result = result.model_copy(update={"task_id": task_id, "revision": doc["revision"],
                                               "round": doc["round"]})
        return VerbOutcome(result, key, self._hint(result, command_type, task_id))

    def _default_key(self, principal: Principal, verb: str, command_type: CommandType, doc: dict[str, Any],
                     acting_round: int, payload: dict[str, Any]) -> str:
        if command_type in STARTS_ROUND and acting_round >= 1:
            earlier = derive_key(principal, verb, doc["task_id"], acting_round - 1, payload)
            done = self.kernel.receipt(principal, earlier)
            if done is not None and done.revision == doc["revision"]:
                return earlier  # this verb moved the task to where it is: the retry replays it
        if command_type is CommandType.RETRY:  # one retry per state of the task, not one per round
            def at(revision: int) -> str:
                return derive_key(principal, verb, doc["task_id"], acting_round,
                                  {"payload": payload, "revision": revision})
            done = self.kernel.receipt(principal, at(doc["revision"] - 1))
            return at(doc["revision"] - 1) if done is not None and done.revision == doc["revision"] else \
                at(doc["revision"])
        return derive_key(principal, verb, doc["task_id"], acting_round, payload)

    def _hint(self, result: CommandResult, command_type: CommandType, task_id: str) -> str | None:
        if result.reason != ReasonCode.PERMISSION_REQUIRED.value:
            return None
        return grant_hint(command_type, task_id, self.grant_session)


def grant_hint(command_type: CommandType, task_id: str, session: str = DEFAULT_SESSION) -> str:
    """The exact command that grants ``command_type`` on the task (a refusal's hint; `taskkernel inbox`)."""
    grant = {"permission": command_type.value, "scope": permission_scope(task_id)}
    return (f"taskkernel session accept {shlex.quote(session)} --kind allow "
            f"--input-id {shlex.quote(f'grant-{command_type.value}-{task_id}')} "
            f"--payload {shlex.quote(json.dumps(grant))}")
