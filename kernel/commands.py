"""TaskCommandKernel: the single entry point for every task mutation.

Checks run in a fixed order, each with a stable reason code (docs/reason-codes.md):
shape -> principal -> idempotency receipt -> task identity -> terminal -> revision ->
round -> role/scope authority -> lifecycle -> guards (protected actions). Only then are
the events, the receipt, the read model and any outbox rows written in one transaction.
A rejected command writes nothing and triggers no effect.
"""

from __future__ import annotations

import difflib
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import sqlalchemy as sa
from pydantic import BaseModel, ValidationError

from taskkernel.kernel import delegation, records, retry
from taskkernel.kernel.canonical import canonical_json, digest, utc_now_iso
from taskkernel.kernel.model.commands import (
    CREATING,
    TASK_ID_ERROR,
    AdoptTaskPayload,
    AmendPayload,
    Command,
    CommandResult,
    CommandType,
    CostTier,
    CreateTaskPayload,
    OptionalReasonPayload,
    ReportPayload,
    canonical_thread_key,
)
from taskkernel.kernel.model.ids import is_dated
from taskkernel.kernel.model.limits import too_large_message
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.model.task import (
    AUTHORITY_FOR,
    EVENT_FOR,
    HISTORY,
    IN_PLACE,
    IN_ROUND,
    OPEN_STATES,
    STARTS_ROUND,
    TERMINAL_STATES,
    TRANSITIONS,
    apply,
    authority_of,
    current_done_report,
    task_stream,
)
from taskkernel.kernel.model.upcasters import task_upcasters
from taskkernel.kernel.queries import task_document
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.store.chain import HEAD_SQL
from taskkernel.kernel.store.db import Database, UnitOfWork
from taskkernel.kernel.store.events import EventStore, NewEvent, RecordedEvent
from taskkernel.kernel.store.schema import receipts, tasks

R = ReasonCode
RISK_ORDER = ("low", "medium", "high", "irreversible")


class RolePolicy(Protocol):
    """What the kernel needs from the role registry (injected; the core imports no role package)."""

    leader: str

    def get(self, code: str) -> Any: ...

    def known(self, code: str) -> bool: ...

    def codes(self) -> list[str]: ...


@dataclass(frozen=True)
class EffectRule:
    """Emit an outbox row named ``effect`` for every accepted event whose type is in ``on``."""

    effect: str
    on: frozenset[str]


Guard = Callable[[UnitOfWork, Command, dict[str, Any] | None, Principal], None]
# Work a guard needs that is too slow for the write lock (a git diff), done before the transaction for each parsed
# command; the guard, inside it, checks that what was prepared still holds before it records it.
Preparer = Callable[[Command, Principal | None], None]
# A guard that lets a command through may leave evidence here; it is recorded in the command's event.
EVIDENCE_KEY = "guard_evidence"
NUMBERS_KEY = "task_numbers_on_disk"  # (UTC day, numbers taken by files), listed before the transaction

# Hot-path statements run on the driver cursor (UnitOfWork.sql); the tables are defined in store/schema.py.
# A command's first read is one statement: its receipt, its task's document and the chain head (which the append
# needs: read here, it costs no statement of its own).
_READ_COMMAND_STATE = ("SELECT r.semantic_digest, r.result, (SELECT doc FROM tasks WHERE task_id = ?), (" + HEAD_SQL
                       + ") FROM (SELECT 1) AS one LEFT JOIN receipts r ON r.idempotency_key = ?")
_GET_TASK = "SELECT doc FROM tasks WHERE task_id = ?"
_TASK_EXISTS = "SELECT 1 FROM tasks WHERE task_id = ?"
_CHILDREN = "SELECT task_id, state FROM tasks WHERE parent = ?"
_INSERT_RECEIPT = ("INSERT INTO receipts (idempotency_key, command_type, semantic_digest, principal, task_id, result,"
                   " first_pos, last_pos, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
_INSERT_TASK = ("INSERT INTO tasks (task_id, state, revision, round, parent, root, recipient, doc, last_pos)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
_UPDATE_TASK = ("UPDATE tasks SET state = ?, revision = ?, round = ?, recipient = ?, doc = ?, last_pos = ?"
                " WHERE task_id = ?")
# When the state stays: naming ``state`` in the SET rewrites its index entry anyway (one more page per commit).
_UPDATE_TASK_IN_PLACE = ("UPDATE tasks SET revision = ?, round = ?, recipient = ?, doc = ?, last_pos = ?"
                         " WHERE task_id = ?")
_INSERT_OUTBOX = ("INSERT INTO outbox (effect_key, effect, payload, source_pos, status, attempts)"
                  " VALUES (?, ?, ?, ?, ?, 0)")
_BUMP_COUNTER = "UPDATE counters SET value = value + 1 WHERE name = ? RETURNING value"
_GET_COUNTER = "SELECT value FROM counters WHERE name = ?"
_SET_COUNTER = "UPDATE counters SET value = ? WHERE name = ?"
_NEW_COUNTER = "INSERT INTO counters (name, value) VALUES (?, ?)"


# Idempotency keys the adapters derive (folder files, schedules, runs, dispatch): an external caller may not
# use them, or an agent could occupy the key of a command the coordinator will submit later.
RESERVED_KEY_PREFIXES = ("file:", "schedule:", "sched:", "run:", "dispatch:", "blocked:", "merge:")


def receipt_key(principal: Principal, idempotency_key: str) -> str:
    """Receipts are scoped to the principal, and a run's credential to its task (``provenance``): one caller
    can never occupy, or replay, another's key, nor a run another task's run's."""
    return f"{principal.provenance}\x1f{idempotency_key}"


class TaskCommandKernel:
    def __init__(self, db: Database, roles: RolePolicy, *, effect_rules: Sequence[EffectRule] = (),
                 guards: Sequence[Guard] = (), store: EventStore | None = None,
                 numbers_in_use: Callable[[str], set[int]] | None = None,
                 preparers: Sequence[Preparer] = (), fcop4_ids: bool = False) -> None:
        self.db = db
        self.roles = roles
        self.store = store or EventStore(task_upcasters())
        self.effect_rules = list(effect_rules)
        self.guards = list(guards)
        self.preparers = list(preparers)
        # Task numbers of a UTC day (YYYYMMDD) taken by files the kernel does not hold (a TASK file not yet
        # ingested, refused or kept): the allocator skips them, so the kernel never hands out a number in use.
        self.numbers_in_use = numbers_in_use
        # An FCoP 4 workspace names tasks TASK-<uuid4 hex>: a task the kernel creates there gets such an id, so
        # its file, fcop's tools and `task show` all use one name.
        self.fcop4_ids = fcop4_ids

    # -- public API ------------------------------------------------------------------------
    def submit(self, command: Mapping[str, Any] | Command, principal: Principal | None, *,
               external: bool = False) -> CommandResult:
        """Judge and, if eligible, apply one command. The result is returned only after commit.
        ``external``: it came from outside the process (CLI, MCP), so adapter key prefixes are refused."""
        return self.submit_batch([(command, principal)], external=external)[0]

    def submit_batch(self, items: Sequence[tuple[Mapping[str, Any] | Command, Principal | None]], *,
                     external: bool = False) -> list[CommandResult]:
        """Judge commands in order inside one write transaction (group commit: one fsync).

        Each command sees the effects of the ones before it. If the transaction fails, nothing of the
        batch is kept and the error propagates; the caller retries each command on its own.
        """
        parsed = [self._parse(c, external) for c, _ in items]
        numbers = self._numbers_on_disk(parsed)  # listed before the write lock is taken, never under it
        for prepare in self.preparers:
            for cmd, (_, principal) in zip(parsed, items, strict=True):
                if isinstance(cmd, Command):
                    prepare(cmd, principal)
        with self.db.write() as uow:
            if numbers is not None:
                uow.cache[NUMBERS_KEY] = numbers
            return [self._judge(uow, p, principal) for p, (_, principal) in zip(parsed, items, strict=True)]

    def _numbers_on_disk(self, parsed: Sequence[Command | CommandResult]) -> tuple[str, set[int]] | None:
        """Today's task numbers taken by files, when a command of the batch will allocate an id."""
        if self.numbers_in_use is None or self.fcop4_ids or not any(
                isinstance(c, Command) and c.type is CommandType.CREATE_TASK and not c.task_id for c in parsed):
            return None
        day = utc_now_iso()[:10].replace("-", "")
        return day, self.numbers_in_use(day)

    def task(self, task_id: str) -> dict[str, Any] | None:
        return task_document(self.db, task_id)

    def receipt(self, principal: Principal, idempotency_key: str) -> CommandResult | None:
        """What the command ``principal`` submitted under ``idempotency_key`` resulted in, if it was accepted."""
        with self.db.read() as conn:
            row = conn.execute(sa.select(receipts.c.result).where(
                receipts.c.idempotency_key == receipt_key(principal, idempotency_key))).scalar()
        return None if row is None else CommandResult(**{**orjson.loads(row), "events": []})

    def children(self, task_id: str) -> list[dict[str, Any]]:
        with self.db.read() as conn:
            rows = conn.execute(sa.select(tasks.c.doc).where(tasks.c.parent == task_id).order_by(tasks.c.task_id))
            return [json.loads(r[0]) for r in rows]

    def history(self, task_id: str) -> list[RecordedEvent]:
        with self.db.read() as conn:
            return self.store.read_stream(conn, task_stream(task_id))

    # -- pipeline ----------------------------------------------------------------------------
    def _parse(self, raw: Mapping[str, Any] | Command, external: bool = False) -> Command | CommandResult:
        """Check 1, outside the transaction: shape of the envelope and of the payload."""
        try:
            cmd = raw if isinstance(raw, Command) else Command.model_validate(raw)
            cmd.validated_payload()
            if external and cmd.idempotency_key.startswith(RESERVED_KEY_PREFIXES):
                prefix = cmd.idempotency_key.split(":", 1)[0]
                return _rejected(R.INVALID_COMMAND, f"idempotency keys starting with {prefix + ':'!r} are reserved "
                                 "to the coordinator's adapters; choose another key", raw)
            if external and (why := records.external_refusal(cmd)):
                return _rejected(R.INVALID_COMMAND, why, raw)
            return cmd
        except ValidationError as exc:
            errors = exc.errors()
            if any(e["type"] == TASK_ID_ERROR for e in errors):
                return _rejected(R.INVALID_TASK_ID, _describe(exc), raw)
            too_large = too_large_message(errors)  # content the folder projection could not write
            return _rejected(R.PAYLOAD_TOO_LARGE if too_large else R.INVALID_COMMAND, too_large or _describe(exc),
                             raw)
        except (TypeError, ValueError) as exc:
            return _rejected(R.INVALID_COMMAND, str(exc), raw)

    def _judge(self, uow: UnitOfWork, cmd: Command | CommandResult, principal: Principal | None
               ) -> CommandResult:
        if isinstance(cmd, CommandResult):
            return cmd
        try:
            return self._execute(uow, cmd, principal)
        except KernelError as exc:
            rejected = _rejected(exc.reason, exc.message, cmd)
            current = self._load(uow, cmd.task_id) if cmd.task_id else None
            if current is not None:  # tell the caller where the task really is, so it can re-read
                rejected.revision, rejected.round = current["revision"], current["round"]
            return rejected

    def _execute(self, uow: UnitOfWork, cmd: Command, principal: Principal | None) -> CommandResult:
        payload = cmd.validated_payload()
        principal = self._check_principal(cmd, payload, principal)
        semantic = digest(cmd.semantic_view(principal.id))
        key = receipt_key(principal, cmd.idempotency_key)
        receipt_digest, receipt_result, doc_text, uow.head_text = uow.sql(
            _READ_COMMAND_STATE, (cmd.task_id, key)).fetchone()
        uow.head_read = True
        stored = self._check_receipt(cmd, receipt_digest, receipt_result, semantic)
        if stored is not None:
            return stored
        doc = self._check_identity(uow, cmd, payload, doc_text)
        self._check_terminal(cmd, doc)
        self._check_revision_and_round(cmd, doc)
        self._check_authority(cmd, payload, doc, principal)
        self._check_lifecycle(uow, cmd, payload, doc)
        for guard in self.guards:
            guard(uow, cmd, doc, principal)
        return self._commit(uow, cmd, payload, doc, principal, semantic, key)

    def _check_principal(self, cmd: Command, payload: BaseModel, principal: Principal | None) -> Principal:
        if principal is None:
            raise KernelError(R.ACTOR_UNVERIFIED, "no valid credential: the caller's identity is unknown")
        for key, claimed in cmd.identity_claims().items():
            if str(claimed) not in (principal.role, principal.agent, principal.id):
                raise KernelError(R.ACTOR_UNVERIFIED,
                                  f"payload claims {key}={claimed!r} but the credential is {principal.id}")
        if (cmd.type is CommandType.CREATE_TASK and isinstance(payload, CreateTaskPayload)
                and payload.sender != principal.role):
            raise KernelError(R.ACTOR_UNVERIFIED,
                              f"sender {payload.sender} does not match the credential's role {principal.role}")
        return principal

    @staticmethod
    def _check_receipt(cmd: Command, receipt_digest: str | None, receipt_result: str | None, semantic: str
                       ) -> CommandResult | None:
        """A stored receipt (digest and result; None: none) makes the command a replay, or a conflict."""
        if receipt_digest is None or receipt_result is None:
            return None
        if receipt_digest != semantic:
            raise KernelError(R.IDEMPOTENCY_CONFLICT,
                              f"idempotency key {cmd.idempotency_key!r} was used for a different command")
        stored = orjson.loads(receipt_result)
        return CommandResult(**{**stored, "status": "replayed", "events": []})

    def _check_identity(self, uow: UnitOfWork, cmd: Command, payload: BaseModel, doc_text: str | None
                        ) -> dict[str, Any] | None:  # doc_text: the stored document of cmd.task_id (None: none)
        if cmd.type in CREATING:
            assert isinstance(payload, CreateTaskPayload)
            if cmd.task_id and doc_text is not None:
                raise KernelError(R.TASK_EXISTS, f"{cmd.task_id} already exists")
            if payload.parent is None:
                return None
            parent = self._load(uow, payload.parent)
            if parent is None:
                raise KernelError(R.TASK_NOT_FOUND, f"parent task {payload.parent} does not exist")
            if cmd.root and cmd.root != parent["root"]:
                raise KernelError(R.TASK_IDENTITY_MISMATCH,
                                  f"root {cmd.root} differs from the parent's root {parent['root']}")
            return parent
        if doc_text is None:
            raise KernelError(R.TASK_NOT_FOUND, f"{cmd.task_id} does not exist")
        doc: dict[str, Any] = orjson.loads(doc_text)
        thread = canonical_thread_key(cmd.thread_key) if cmd.thread_key is not None else doc["thread_key"]
        if thread != doc["thread_key"]:
            raise KernelError(R.THREAD_MISMATCH,
                              f"thread {thread!r} is not the thread of {cmd.task_id} ({doc['thread_key']!r})")
        if cmd.root and cmd.root != doc["root"]:
            raise KernelError(R.TASK_IDENTITY_MISMATCH, f"root {cmd.root} is not {cmd.task_id}'s root {doc['root']}")
        return doc

    @staticmethod
    def _check_terminal(cmd: Command, doc: dict[str, Any] | None) -> None:
        if cmd.type in HISTORY:  # the past of an archived task (or of its children) is still its past
            return
        if doc is not None and doc["state"] in TERMINAL_STATES:
            what = "parent task" if cmd.type in CREATING else "task"
            raise KernelError(R.TASK_TERMINAL, f"{what} {doc['task_id']} is archived; nothing may change it")
        if (finished := retry.finished_refusal(cmd, doc)) is not None:
            raise finished

    @staticmethod
    def _check_revision_and_round(cmd: Command, doc: dict[str, Any] | None) -> None:
        if cmd.type in CREATING or doc is None:
            return
        if cmd.expected_revision != doc["revision"]:
            raise KernelError(R.STALE_TASK_REVISION,
                              f"expected revision {cmd.expected_revision}, {doc['task_id']} is at {doc['revision']}")
        if cmd.round != doc["round"]:
            raise KernelError(R.STALE_ROUND, f"command is for round {cmd.round}, "
                              f"{doc['task_id']} is in round {doc['round']}")

    def _check_authority(self, cmd: Command, payload: BaseModel, doc: dict[str, Any] | None,
                         principal: Principal) -> None:
        if records.check_author(cmd, principal):  # the coordinator's own record of a merge
            return
        spec = self.roles.get(principal.role)
        if not spec.may_issue(cmd.type):
            raise KernelError(R.ROLE_NOT_AUTHORIZED, f"role {principal.role} may not issue {cmd.type.value}")
        scope_task = doc["task_id"] if doc is not None else None
        if principal.task_id is not None and principal.task_id != scope_task:
            raise KernelError(R.ROLE_NOT_AUTHORIZED,
                              f"credential is scoped to {principal.task_id}, not {scope_task or 'a new root task'}")
        if principal.round is not None and doc is not None and principal.round != doc["round"] \
                and principal.task_id == doc["task_id"]:
            raise KernelError(R.ROLE_NOT_AUTHORIZED,
                              f"credential is for round {principal.round}; the task is in round {doc['round']}")
        if cmd.type is CommandType.CREATE_TASK:
            assert isinstance(payload, CreateTaskPayload)
            self._check_known_roles(payload)
        if isinstance(payload, CreateTaskPayload) and doc is not None:
            self._check_inherited_policy(payload, doc)
        if principal.is_admin:
            self._check_decider(cmd, payload)
            return
        if cmd.type in HISTORY:
            raise KernelError(R.ROLE_NOT_AUTHORIZED, f"only ADMIN may import history ({cmd.type.value})")
        if cmd.type is CommandType.CREATE_TASK:
            assert isinstance(payload, CreateTaskPayload)
            self._check_assignment(spec, payload, doc, principal)
            self._check_decider(cmd, payload)
            return
        assert doc is not None
        if isinstance(payload, AmendPayload) and payload.risk_level is not None and \
                RISK_ORDER.index(payload.risk_level.value) < RISK_ORDER.index(doc["risk_level"]):
            raise KernelError(R.ROLE_NOT_AUTHORIZED, f"only ADMIN may lower a task's risk level "
                              f"({doc['risk_level']} -> {payload.risk_level.value}): it decides which grants apply")
        needed = AUTHORITY_FOR[cmd.type]
        holders = {doc["authority"][needed]}
        if cmd.type is CommandType.AMEND:
            holders.add(doc["sender"])
        if principal.role not in holders:
            raise KernelError(R.ROLE_NOT_AUTHORIZED, f"{cmd.type.value} on {doc['task_id']} needs "
                              f"{needed} ({' or '.join(sorted(holders))}), not {principal.role}")

    def _check_assignment(self, spec: Any, payload: CreateTaskPayload, parent: dict[str, Any] | None,
                          principal: Principal) -> None:
        refused = delegation.refusal(payload, str(getattr(spec, "assign_scope", "nobody")), self.roles.leader)
        if refused is not None:  # who it addresses and whom it hands driver / done / archive authority to
            raise refused
        if parent is not None:
            members = {parent["sender"], *parent["authority"].values()}
            if principal.role not in members:
                raise KernelError(R.ROLE_NOT_AUTHORIZED,
                                  f"{principal.role} takes no part in {parent['task_id']} and cannot add children")

    def _check_decider(self, cmd: Command, payload: BaseModel) -> None:
        """A new task's done authority can decide it (ADMIN's creates too; imported history is not judged)."""
        if cmd.type is CommandType.CREATE_TASK and isinstance(payload, CreateTaskPayload) and \
                (undecidable := delegation.decider_refusal(payload, self.roles)) is not None:
            raise undecidable

    def _check_known_roles(self, payload: CreateTaskPayload) -> None:
        """A new task is for roles the team has (ADMIN, the team, installed role packages): one for any other
        role would never be run. History (``adopt_task``) is the record of the past and is taken as it is."""
        for field in ("recipient", "driver", "done_authority", "archive_authority"):
            role = getattr(payload, field)
            if role is not None and not self.roles.known(role):
                codes = self.roles.codes()
                guess = difflib.get_close_matches(role, codes, n=1, cutoff=0.6)
                raise KernelError(R.UNKNOWN_ROLE, f"{field} {role} is not a role of the team ({', '.join(codes)})"
                                  + (f"; did you mean {guess[0]}?" if guess else ""))

    @staticmethod
    def _check_inherited_policy(payload: CreateTaskPayload, parent: dict[str, Any]) -> None:
        """Cost tier and budget belong to the root; a descendant may narrow them, never widen them."""
        tier = CostTier(parent["cost_tier"])
        if payload.cost_tier is not None and payload.cost_tier.rank > tier.rank:
            raise KernelError(R.POLICY_ESCALATION, f"cost tier {payload.cost_tier.value} exceeds the root's "
                              f"{tier.value}; a child inherits its root's policy")
        if payload.budget is not None:
            limits = parent["budget"] or {}
            for name, wanted in payload.budget.model_dump(exclude_none=True).items():
                if limits.get(name) is not None and wanted > limits[name]:
                    raise KernelError(R.POLICY_ESCALATION,
                                      f"budget {name}={wanted} exceeds the root's {limits[name]}")

    def _check_lifecycle(self, uow: UnitOfWork, cmd: Command, payload: BaseModel, doc: dict[str, Any] | None) -> None:
        if doc is None or cmd.type in CREATING:
            return
        state = doc["state"]
        if cmd.type in TRANSITIONS:
            sources, target = TRANSITIONS[cmd.type]
            if state not in sources:
                raise KernelError(R.ILLEGAL_TRANSITION,
                                  f"{cmd.type.value} is {state} -> {target.value}: not an allowed edge")
        elif state not in IN_PLACE[cmd.type]:
            raise KernelError(R.ILLEGAL_TRANSITION, f"{cmd.type.value} is not allowed while the task is {state}")
        if cmd.type is CommandType.SUBMIT and current_done_report(doc) is None:
            raise KernelError(R.REPORT_REQUIRED,
                              f"submit needs a `done` report for round {doc['round']} of {doc['task_id']}")
        if cmd.type is CommandType.ARCHIVE:
            open_child = self._first_open_descendant(uow, doc["task_id"])
            if open_child:
                raise KernelError(R.CHILD_TASKS_OPEN, f"child task {open_child[0]} is still {open_child[1]}")
        if isinstance(payload, ReportPayload) and payload.report_id and \
                any(r["report_id"] == payload.report_id for r in doc["reports"]):
            raise KernelError(R.INVALID_COMMAND, f"report {payload.report_id} is already recorded")

    def _first_open_descendant(self, uow: UnitOfWork, task_id: str) -> tuple[str, str] | None:
        frontier, seen = [task_id], {task_id}
        while frontier:
            parent = frontier.pop()
            for child_id, state in uow.sql(_CHILDREN, (parent,)).fetchall():
                if state in OPEN_STATES:
                    return child_id, state
                if child_id not in seen:
                    seen.add(child_id)
                    frontier.append(child_id)
        return None

    # -- writing -----------------------------------------------------------------------------
    def _commit(self, uow: UnitOfWork, cmd: Command, payload: BaseModel, doc: dict[str, Any] | None,
                principal: Principal, semantic: str, key: str) -> CommandResult:
        """Write the accepted command: its event, the read model, its receipt (under ``key``) and outbox rows."""
        now = utc_now_iso()
        if cmd.type in CREATING:
            assert isinstance(payload, CreateTaskPayload)
            data = self._creation_data(uow, cmd, payload, doc, now)
            task_id, expected, doc = data["task_id"], 0, None
        else:
            assert doc is not None and cmd.task_id is not None
            task_id, expected, data = cmd.task_id, doc["revision"], self._event_data(cmd, payload, doc)
        data["by"] = principal.id
        data.update(uow.cache.pop(EVIDENCE_KEY, {}))  # what guards established (e.g. the gate verdict)
        event_type = EVENT_FOR[cmd.type]
        kind = str(cmd.type)  # a StrEnum's value: str() is C, ``.value`` two Python frames (hot path)
        meta = {"actor": principal.agent, "role": principal.role, "command_id": cmd.idempotency_key,
                "command_type": kind, "causation_id": cmd.idempotency_key,
                "correlation_id": data.get("root") or (doc or {}).get("root"), "recorded_at": now}
        if cmd.transport:
            meta["transport"] = cmd.transport
        recorded = self.store.append(uow, task_stream(task_id), expected, [NewEvent(event_type, data)], meta,
                                     verified_version=True)
        ev = recorded[-1]
        was = doc["state"] if doc is not None else None  # apply moves the document itself
        new_doc = apply(doc, event_type, data, ev.stream_version, now)
        self._save_projection(uow, new_doc, ev.global_pos, was=was)
        result = CommandResult(  # pydantic-core's validation of these few values is quicker than model_construct
            status="accepted", message=_accepted_message(cmd.type, new_doc), task_id=task_id,
            revision=new_doc["revision"], round=new_doc["round"], events=[e.global_pos for e in recorded])
        uow.sql(_INSERT_RECEIPT, (key, kind, semantic, principal.id, task_id, canonical_json(result.wire()),
                                  recorded[0].global_pos, ev.global_pos, now))
        self._write_outbox(uow, recorded, new_doc)
        return result

    def _creation_data(self, uow: UnitOfWork, cmd: Command, p: CreateTaskPayload,
                       parent: dict[str, Any] | None, now: str) -> dict[str, Any]:
        task_id = cmd.task_id or self._allocate_task_id(uow, now)
        if cmd.task_id and is_dated(cmd.task_id):
            self._reserve_explicit_id(uow, cmd.task_id)
        thread = canonical_thread_key(cmd.thread_key) or (parent["thread_key"] if parent else task_id)
        return {"task_id": task_id, "thread_key": thread, "parent": p.parent,
                "root": parent["root"] if parent else task_id, "sender": p.sender, "recipient": p.recipient,
                "subject": p.subject, "body": p.body, "priority": str(p.priority), "risk_level": str(p.risk_level),
                "references": list(p.references), "authority": authority_of(p),
                "cost_tier": (str(p.cost_tier) if p.cost_tier else parent["cost_tier"] if parent else "standard"),
                "budget": (p.budget.model_dump() if p.budget else parent["budget"] if parent else None),
                **({"state": p.state, "round": p.round, "source": p.source} if isinstance(p, AdoptTaskPayload) else {})}

    @staticmethod
    def _event_data(cmd: Command, payload: BaseModel, doc: dict[str, Any]) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if cmd.type in STARTS_ROUND:
            data["round"] = doc["round"] + 1
        if cmd.type in IN_ROUND:
            data["round"] = doc["round"]
        if cmd.type in TRANSITIONS:
            data["from"] = doc["state"]
        if cmd.type is CommandType.SUBMIT:
            report = current_done_report(doc)
            assert report is not None
            data["report_id"] = report["report_id"]
        elif isinstance(payload, ReportPayload):
            data.update(report_id=payload.report_id or f"{doc['task_id']}/r{doc['round']}/{len(doc['reports']) + 1}",
                        round=doc["round"], status=str(payload.status), body=payload.body,
                        references=list(payload.references),
                        **({"artifacts": list(payload.artifacts)} if payload.artifacts else {}))
        elif cmd.type is CommandType.AMEND:
            data["changes"] = payload.model_dump(mode="json", exclude_none=True)
        elif cmd.type is CommandType.PERFORM:
            data.update(payload.model_dump(mode="json"), action_id=cmd.idempotency_key, round=doc["round"])
        elif type(payload).model_fields:  # a reopen without a reason records no reason field, exactly as before
            data.update(payload.model_dump(mode="json", exclude_none=isinstance(payload, OptionalReasonPayload)))
        # else: a payload model without fields (claim, submit, approve, ...) dumps to {}: nothing to serialise
        return data

    def _allocate_task_id(self, uow: UnitOfWork, now_iso: str) -> str:
        if self.fcop4_ids:
            return f"TASK-{uuid.uuid4().hex}"
        day = now_iso[:10].replace("-", "")  # UTC date
        listed_day, in_use = uow.cache.get(NUMBERS_KEY, (day, set()))
        if listed_day != day and self.numbers_in_use is not None:  # the batch crossed midnight (UTC)
            in_use = self.numbers_in_use(day)
        while True:
            n = _bump_counter(uow, f"task:{day}")
            task_id = f"TASK-{day}-{n:03d}"
            if n not in in_use and not uow.sql(_TASK_EXISTS, (task_id,)).fetchone():
                return task_id

    @staticmethod
    def _reserve_explicit_id(uow: UnitOfWork, task_id: str) -> None:
        """Keep the allocator ahead of explicitly numbered tasks so it never hands out their id."""
        _, day, num = task_id.split("-")
        name = f"task:{day}"
        row = uow.sql(_GET_COUNTER, (name,)).fetchone()
        if row is None:
            uow.sql(_NEW_COUNTER, (name, int(num)))
        elif row[0] < int(num):
            uow.sql(_SET_COUNTER, (int(num), name))

    @staticmethod
    def _load(uow: UnitOfWork, task_id: str) -> dict[str, Any] | None:
        row = uow.sql(_GET_TASK, (task_id,)).fetchone()
        return orjson.loads(row[0]) if row else None

    @staticmethod
    def _save_projection(uow: UnitOfWork, doc: dict[str, Any], pos: int, *, was: str | None) -> None:
        """``was``: the task's state before the event (None: the task is new)."""
        text = canonical_json(doc)
        if was is None:
            uow.sql(_INSERT_TASK, (doc["task_id"], doc["state"], doc["revision"], doc["round"], doc["parent"],
                                   doc["root"], doc["recipient"], text, pos))
        elif was == doc["state"]:
            uow.sql(_UPDATE_TASK_IN_PLACE, (doc["revision"], doc["round"], doc["recipient"], text, pos, doc["task_id"]))
        else:
            uow.sql(_UPDATE_TASK, (doc["state"], doc["revision"], doc["round"], doc["recipient"], text, pos,
                                   doc["task_id"]))

    def _write_outbox(self, uow: UnitOfWork, recorded: Iterable[RecordedEvent], doc: dict[str, Any]) -> None:
        if not self.effect_rules:
            return
        rows = [(f"{rule.effect}:{ev.global_pos}", rule.effect,
                 canonical_json({"event_type": ev.type, "global_pos": ev.global_pos, "task_id": doc["task_id"],
                                 "state": doc["state"], "revision": doc["revision"], "round": doc["round"],
                                 "recipient": doc["recipient"]}),
                 ev.global_pos, "pending")
                for ev in recorded for rule in self.effect_rules if ev.type in rule.on]
        if rows:
            uow.sql_many(_INSERT_OUTBOX, rows)


def _bump_counter(uow: UnitOfWork, name: str) -> int:
    """Gapless named counter: incremented inside the caller's write transaction."""
    row = uow.sql(_BUMP_COUNTER, (name,)).fetchone()
    if row is not None:
        return int(row[0])
    uow.sql(_NEW_COUNTER, (name, 1))
    return 1


def _rejected(reason: ReasonCode, message: str, raw: Any) -> CommandResult:
    task_id = raw.task_id if isinstance(raw, Command) else (raw.get("task_id") if isinstance(raw, Mapping) else None)
    return CommandResult(status="rejected", reason=reason.value, message=message,
                         task_id=task_id if isinstance(task_id, str) else None)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(x) for x in err["loc"]) or "command"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _accepted_message(kind: CommandType, doc: dict[str, Any]) -> str:
    return (f"{kind} accepted: {doc['task_id']} is {doc['state']} "
            f"(revision {doc['revision']}, round {doc['round']})")
