"""The MCP tools, synchronous and free of the SDK: the server, the tests and bench/mcp.py run this same code.

Every call is made as a principal the caller's credential stands for *now* (the server authenticates again at
each call). Writes are commands judged by TaskCommandKernel exactly as `taskkernel submit`'s and the CLI
verbs' (kernel/verbs.py): shape, credential and its scope, receipt, identity, revision, round, authority,
lifecycle, grants and the execution gate. Reads use kernel/queries.py and never write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from taskkernel.coordinator.folders.tracking import FileTracker
from taskkernel.coordinator.mcp import schemas as S
from taskkernel.coordinator.mcp.catalog import TOOL_NAMES, TOOLS, Tool
from taskkernel.coordinator.mcp.results import (
    CursorError,
    Outcome,
    command_outcome,
    cut_list,
    cut_text,
    decode,
    encode,
    fit,
    refusal,
    refused,
    size,
    squeeze,
)
from taskkernel.coordinator.runners.inputs import NO_RUN, Pending, RunInputs, role_specs
from taskkernel.coordinator.runners.live import latest_events
from taskkernel.coordinator.workspace import Workspace
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.gate import TraceIndex, evaluate
from taskkernel.kernel.history import history_entry
from taskkernel.kernel.model.commands import CommandType
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.permissions import DEFAULT_SESSION
from taskkernel.kernel.protected import SEQ_STRIDE, DamagedLog, GateGuard, build_trace
from taskkernel.kernel.queries import TaskQueryError, count_tasks, encode_cursor, page_tasks, task_history
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.sessionlog import SessionLog, SessionLogError
from taskkernel.kernel.sessionlog.authority import DEFAULT_ADMIN_SESSIONS
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.usage import install as install_usage
from taskkernel.kernel.usage import since_utc, summarize
from taskkernel.kernel.verbs import TaskVerbs, derive_key

INVALID_ARGUMENTS = "invalid_arguments"  # well-typed arguments that cannot be served together
INVALID_CURSOR = "invalid_cursor"  # a cursor another listing (or another call) printed
CHILDREN_MAX = 100  # children read for get_task (more: list_tasks parent=…)
HISTORY_REASON_CHARS = 300  # characters of a reject/archive reason in get_task's history
MAX_INSTRUCTION_TEXT = 4_000  # characters of one resumed instruction (the anchor's own cut)
PLANNED_ACTION = "planned-action"  # the action id check_action judges
LIVE_TEXT = 300  # characters of one live event in get_task
READ_INPUTS_MAX = 50  # instructions one read_inputs answers at most
NOTICE_ROOM = 300  # bytes kept free in an answer for the pending-inputs notice
__all__ = ["TOOLS", "TOOL_NAMES", "TaskTools", "Tool", "own_session"]


def own_session(principal: Principal) -> str:
    """The session add_progress writes and resume reads by default: the caller's provenance (a run's token:
    ``RUN:ROLE:agent@TASK``, shared by that task's runs, so a later run resumes where an earlier one stopped)."""
    return principal.provenance


class TaskTools:
    """The tools over one kernel (built once per server)."""

    def __init__(self, db: Database, kernel: TaskCommandKernel, workspace: Workspace | None, *,
                 transport: str = "stdio", budget: int = 16384) -> None:
        self.db = db
        self.kernel = kernel
        self.workspace = workspace
        self.transport = transport
        self.budget = budget
        self.verbs = TaskVerbs(kernel, grant_session=DEFAULT_SESSION)
        self.log = SessionLog(db, workspace.grant_sessions if workspace else DEFAULT_ADMIN_SESSIONS)
        self.gate = next((g for g in kernel.guards if isinstance(g, GateGuard)), None)
        install_usage(db)
        self.files = FileTracker(db) if workspace is not None else None  # where the folder adapter put TASK files
        self.inputs = RunInputs(db, self.log, role_specs(workspace.config) if workspace else {})
        self._methods: dict[str, Callable[[Principal, Any], Outcome]] = {t.name: getattr(self, t.name)
                                                                          for t in TOOLS}

    def run(self, name: str, who: Callable[[], Principal], args: S.Args) -> Outcome:
        """One call: the caller's principal now (a credential revoked since is refused), then the tool; its
        answer within the output budget, whatever it is (``fit``)."""
        try:
            principal = who()
        except KernelError as exc:
            return refused(exc)
        try:
            outcome = self._methods[name](principal, args)
        except KernelError as exc:
            outcome = refused(exc)
        except SessionLogError as exc:
            outcome = refusal(exc.reason.value, exc.message)
        if principal.task_id is not None and (waiting := self.inputs.pending_in(principal.provenance)):
            outcome.structured["pending_inputs"] = {
                "count": waiting, "tool": "read_inputs",
                "message": f"{waiting} instruction(s) for you since you last read: call read_inputs now"}
        return fit(outcome, self.budget)

    # -- identity ------------------------------------------------------------------------------------------------
    def whoami(self, p: Principal, _: S.NoArgs) -> Outcome:
        doc = _out(S.WhoamiOut, status="ok", principal={
            "id": p.id, "role": p.role, "agent": p.agent, "task_id": p.task_id, "round": p.round,
            "provenance": p.provenance, "admin": p.is_admin}, session=own_session(p), transport=self.transport,
            workspace=str(self.workspace.root) if self.workspace else None, output_budget=self.budget)
        return Outcome(doc)

    # -- reads ---------------------------------------------------------------------------------------------------
    def list_tasks(self, p: Principal, a: S.ListTasksArgs) -> Outcome:
        state = a.state
        if a.waiting_for_my_review:
            if state not in (None, "review"):
                return refusal(INVALID_ARGUMENTS, f"waiting_for_my_review lists tasks in review, not in {state}")
            state = "review"
        extra = {"driver": p.role if a.assigned_to_me else None,
                 "done_authority": p.role if a.waiting_for_my_review else None, "root": a.root, "parent": a.parent}
        try:
            page = page_tasks(self.db, state=state, limit=a.limit, after=a.cursor, **extra)
        except TaskQueryError as exc:
            return refusal(INVALID_CURSOR, str(exc))
        doc = cut_list({"status": "ok", "tasks": page.rows, "count": len(page.rows), "truncated": False,
                        "next_cursor": page.next_cursor}, "tasks", self.budget,
                       lambda row: encode_cursor(row["task_id"], state, None, **extra), minimum=1)
        doc["count"] = len(doc["tasks"])
        return Outcome(doc)

    def get_task(self, p: Principal, a: S.GetTaskArgs) -> Outcome:
        doc = self.kernel.task(a.task_id)
        if doc is None:
            return refusal(ReasonCode.TASK_NOT_FOUND.value, f"{a.task_id} does not exist (see list_tasks)",
                           task_id=a.task_id)
        events = task_history(self.db, a.task_id)
        written = {ev.data.get("report_id"): (ev.data, ev.recorded_at) for ev in events
                   if ev.type == "report_submitted"}  # the bodies; the document lists every report (imported too)
        reports = [_report({**entry, **written.get(entry.get("report_id"), ({}, None))[0]},
                           written.get(entry.get("report_id"), ({}, None))[1]) for entry in doc.get("reports", ())]
        doc = {k: v for k, v in doc.items() if k != "reports"}  # they are `reports`: never sent twice
        if a.report_id is not None:
            reports = [r for r in reports if r["report_id"] == a.report_id]
            if not reports:
                return refusal(ReasonCode.TASK_NOT_FOUND.value, f"{a.task_id} has no report {a.report_id!r}",
                               task_id=a.task_id, revision=doc["revision"], round_=doc["round"])
        children = page_tasks(self.db, parent=a.task_id, limit=CHILDREN_MAX)
        history = [_history(ev) for ev in events]
        children_total = count_tasks(self.db, parent=a.task_id) if children.next_cursor else len(children.rows)
        full = {"status": "ok", "task": doc, "reports": reports, "reports_total": len(reports),
                "children": children.rows, "children_total": children_total,
                "children_next": None, "history": history[-a.history_limit:] if a.history_limit else [],
                "history_total": len(history), "live": self._live(a.task_id, a.live_limit), "truncated": False}
        if children.next_cursor:
            full["children_next"] = {"tool": "list_tasks", "arguments": {"parent": a.task_id,
                                                                         "cursor": children.next_cursor}}
        return Outcome(_fit_task(full, a, self.budget))

    def _live(self, task_id: str, limit: int) -> list[dict[str, Any]]:
        """The newest live events of the task's runs, each text cut to LIVE_TEXT, within a fifth of the budget
        (the oldest dropped first): a glance at what its agent is doing, `runs follow` has the rest."""
        if not limit:
            return []
        events = [{k: e[k] for k in ("run_id", "n", "attempt", "at", "kind", "tool")} | {"text": e["text"][:LIVE_TEXT]}
                  for e in latest_events(self.db, task_id, limit)]
        while events and size(events) > self.budget // 5:
            events.pop(0)
        return events

    # -- commands ------------------------------------------------------------------------------------------------
    def create_task(self, p: Principal, a: S.CreateTaskArgs) -> Outcome:
        payload = a.model_dump(mode="json", exclude_defaults=True, exclude={"idempotency_key"})
        payload.update(recipient=a.recipient, subject=a.subject)
        outcome = self.verbs.create(p, payload, key=a.idempotency_key)
        return command_outcome(outcome.result, outcome.key, outcome.hint)

    def _act(self, p: Principal, verb: str, a: S.TaskArgs, payload: dict[str, Any] | None = None) -> Outcome:
        outcome = self.verbs.act(p, verb, a.task_id, payload or {}, expect_rev=a.expect_rev, round_=a.round,
                                 key=a.idempotency_key)
        return command_outcome(outcome.result, outcome.key, outcome.hint)

    def claim_task(self, p: Principal, a: S.TaskArgs) -> Outcome:
        return self._act(p, "claim", a)

    def report(self, p: Principal, a: S.ReportArgs) -> Outcome:
        payload: dict[str, Any] = {"status": a.status, "body": a.body}
        if a.artifacts:
            payload["artifacts"] = a.artifacts
        if a.references:
            payload["references"] = a.references
        return self._act(p, "report", a, payload)

    def submit_task(self, p: Principal, a: S.TaskArgs) -> Outcome:
        return self._act(p, "submit", a)

    def approve_task(self, p: Principal, a: S.TaskArgs) -> Outcome:
        return self._act(p, "approve", a)

    def reject_task(self, p: Principal, a: S.RejectArgs) -> Outcome:
        return self._act(p, "reject", a, {"reason": a.reason})

    def archive_task(self, p: Principal, a: S.ArchiveArgs) -> Outcome:
        return self._act(p, "archive", a, {"reason": a.reason or "archived"})

    def retry_task(self, p: Principal, a: S.RetryArgs) -> Outcome:
        return self._act(p, "retry", a, {"reason": a.reason} if a.reason else None)

    def perform(self, p: Principal, a: S.PerformArgs) -> Outcome:
        doc = self.kernel.task(a.task_id)
        if doc is None:
            return refusal(ReasonCode.TASK_NOT_FOUND.value, f"{a.task_id} does not exist", task_id=a.task_id)
        payload = _action_payload(a)
        acting_round = doc["round"] if a.round is None else a.round
        key = a.idempotency_key or derive_key(p, "perform", a.task_id, acting_round,
                                              {**payload, "permission_session": a.session})
        command: dict[str, Any] = {"type": CommandType.PERFORM.value, "task_id": a.task_id, "round": acting_round,
                                   "expected_revision": doc["revision"] if a.expect_rev is None else a.expect_rev,
                                   "idempotency_key": key, "payload": payload}
        if a.session is not None:
            command["permission_session"] = a.session
        return command_outcome(self.kernel.submit(command, p, external=True), key)

    # -- people in the loop ----------------------------------------------------------------------------------------
    def read_inputs(self, p: Principal, _: S.NoArgs) -> Outcome:
        session = own_session(p)
        if p.task_id is None:
            return refusal(INVALID_ARGUMENTS, "read_inputs reads a run's instructions: your credential is no run's")
        running = self.inputs.running_run(p.task_id)
        room = self.budget - NOTICE_ROOM  # a pending-inputs notice may still be added to the answer
        answers: dict[int, dict[str, Any]] = {}  # what is answered is decided before anything is consumed

        def fitting(pending: list[Pending]) -> int:
            for n in range(min(len(pending), READ_INPUTS_MAX), 0, -1):
                doc = _inputs_doc(session, pending[:n], len(pending) - n)
                if size(doc) <= room or n == 1:
                    answers[n] = doc if size(doc) <= room else _cut_to(doc, room)
                    return n
            return 0

        taken = self.inputs.deliver(session, *(running or (NO_RUN, 0)), "tool", fits=fitting)
        if not taken:
            return Outcome(_inputs_doc(session, [], self.inputs.pending_in(session)))
        doc = answers[len(taken)]
        doc["remaining"] = self.inputs.pending_in(session)
        return Outcome(doc)

    def say_to_task(self, p: Principal, a: S.SayArgs) -> Outcome:
        return Outcome(_out(S.SayOut, **self.inputs.say(p, a.task_id, a.text, a.mode, question_id=a.question_id,
                                                        anchor=a.anchor,
                                                        input_id=a.input_id)))

    def interrupt_task(self, p: Principal, a: S.InterruptArgs) -> Outcome:
        return Outcome(_out(S.InterruptOut, **self.inputs.interrupt(p, a.task_id, a.message)))

    # -- sessions ------------------------------------------------------------------------------------------------
    def add_progress(self, p: Principal, a: S.AddProgressArgs) -> Outcome:
        session = a.session or own_session(p)
        payload = {"text": a.text, "completed_tool_calls": a.completed_tool_calls, "done": a.done}
        if a.input_id is None:
            res = self.log.checkpoint(session, payload, writer=p)
        else:
            res = self.log.accept(session, {"input_id": a.input_id, "kind": "progress", "payload": payload},
                                  writer=p)
        input_id = res.input_id
        if res.status == "refused" or res.accept_seq is None:
            return refusal("input_refused", f"{input_id!r} was refused earlier in {session!r}: {res.reason}")
        doc = _out(S.ProgressOut, status=res.status, session=session, input_id=input_id, accept_seq=res.accept_seq)
        return Outcome(doc)

    def resume(self, p: Principal, a: S.ResumeArgs) -> Outcome:
        session = a.session or own_session(p)
        skip = 0
        if a.cursor is not None:
            try:
                skip = int(decode(a.cursor, "resume", {"session": session})["skip"])
            except (CursorError, KeyError, TypeError, ValueError) as exc:
                return refusal(INVALID_CURSOR, str(exc) if isinstance(exc, CursorError) else "not a resume cursor")
        self.log.check_read(session, p)
        bounds = {k: v for k, v in (("max_inputs", a.max_inputs), ("max_bytes", a.max_bytes)) if v is not None}
        answer = self.log.resume(session, **bounds)
        doc = answer.model_dump(mode="json")
        instructions = []
        for ins in doc["instructions"][skip:]:
            text, rest = cut_text(ins["text"], 0, MAX_INSTRUCTION_TEXT)
            instructions.append({**ins, "text": text, "text_truncated": rest is not None})
        doc.update(instructions=instructions, truncated=False, next_cursor=None)
        positions = {id(ins): skip + i + 1 for i, ins in enumerate(instructions)}
        doc = cut_list(doc, "instructions", self.budget,
                       lambda ins: encode({"kind": "resume", "session": session,
                                           "skip": positions[id(ins)] if ins is not None else skip}), minimum=1)
        if doc["instructions"] and size(doc) > self.budget:  # one instruction too long alone: its text is cut
            first = doc["instructions"][0]                  # (in bytes, as written), the cursor still moves on
            text = first["text"]
            doc["instructions"][0] = {**first, "text_truncated": True}
            low, high = 0, len(text)  # the longest prefix that fits lies in [low, high)
            while high - low > 1:
                mid = (low + high) // 2
                doc["instructions"][0]["text"] = text[:mid]
                low, high = (mid, high) if size(doc) <= self.budget else (low, mid)
            doc["instructions"][0]["text"] = text[:low]
            if doc["next_cursor"] is None and positions[id(first)] < skip + len(instructions):
                doc.update(truncated=True, next_cursor=encode({"kind": "resume", "session": session,
                                                               "skip": positions[id(first)]}))
        return Outcome(doc)

    # -- the execution gate ----------------------------------------------------------------------------------------
    def check_action(self, p: Principal, a: S.ActionArgs) -> Outcome:
        doc = self.kernel.task(a.task_id)
        if doc is None:
            return refusal(ReasonCode.TASK_NOT_FOUND.value, f"{a.task_id} does not exist", task_id=a.task_id)
        if self.gate is None:  # pragma: no cover - compose.build_kernel always installs the gate
            return refusal("gate_unavailable", "this kernel has no execution gate")
        session = a.session or self.gate.default_session
        if session != self.gate.default_session:  # another session is read under the session log's read rule
            self.log.check_read(session, p)  # (its verdict quotes the inputs: no oracle for what `resume` refuses)
        records = self.gate.log.records(session)
        head = max((r.seq or 0 for r in records), default=0)
        try:  # the trace exactly as the kernel's GateGuard builds it for `perform`
            trace = build_trace(records, self.gate.protected_operations(doc["risk_level"], p.role))
        except DamagedLog as exc:
            return refusal(ReasonCode.GATE_INSUFFICIENT_EVIDENCE.value, f"session {session!r}: {exc}",
                           task_id=a.task_id, revision=doc["revision"], round_=doc["round"])
        except (KeyError, TypeError, ValueError) as exc:
            return refusal(ReasonCode.GATE_INSUFFICIENT_EVIDENCE.value,
                           f"session {session!r} holds an input the gate cannot read ({exc!r})", task_id=a.task_id,
                           revision=doc["revision"], round_=doc["round"])
        payload = _action_payload(a)
        plan_seq = head if a.plan_seq is None else min(a.plan_seq, head)
        action = {"id": PLANNED_ACTION, "seq": plan_seq * SEQ_STRIDE + SEQ_STRIDE // 2, "kind": "action",
                  "principal": p.role, "tool": a.tool, "operation": a.operation, "entity": a.entity,
                  "args": a.args, "based_on_event": payload.get("based_on_event"),
                  "permission_event": payload.get("permission_event"),
                  "requires_state": payload.get("requires_state")}
        verdict = evaluate(TraceIndex.from_events(trace), action)
        out = {"status": "ok", "allowed": verdict.passed, "task_id": doc["task_id"], "state": doc["state"],
               "revision": doc["revision"], "round": doc["round"], "session": session, "session_head_seq": head,
               "plan_seq": plan_seq, "verdict": verdict.to_dict(), "truncated": False}
        if size(out) > self.budget:
            out = {**out, "verdict": {**out["verdict"], "checks": None}, "truncated": True}
            squeeze(out["verdict"], self.budget - (size(out) - size(out["verdict"])),
                    keep=frozenset({"status", "decision", "code", "rule"}))
        return Outcome(out)

    # -- usage ---------------------------------------------------------------------------------------------------
    def usage(self, p: Principal, a: S.UsageArgs) -> Outcome:
        since = None
        if a.since is not None:
            since = since_utc(a.since)
            if since is None:
                return refusal(INVALID_ARGUMENTS, f"since {a.since!r} is neither an ISO date or time "
                                                  "(2026-11-30, 2026-11-30T23:59Z) nor an age (30m, 24h, 7d, 2w)")
        offset = 0
        if a.cursor is not None:
            try:
                offset = int(decode(a.cursor, "usage", {"by": a.by, "since": since})["offset"])
            except (CursorError, KeyError, TypeError, ValueError) as exc:
                return refusal(INVALID_CURSOR, str(exc) if isinstance(exc, CursorError) else "not a usage cursor")
        rows = summarize(self.db, a.by, since)
        total = {k: sum(r[k] for r in rows) for k in ("units", "wall_ms", "tokens_in", "tokens_out")}
        total["cost_usd"] = round(sum(r["cost_usd"] for r in rows), 6)
        page = rows[offset:offset + a.limit]
        after = {id(r): offset + i + 1 for i, r in enumerate(page)}

        def cursor(row: dict[str, Any] | None) -> str:
            return encode({"kind": "usage", "by": a.by, "since": since,
                           "offset": after[id(row)] if row is not None else offset})

        more = offset + a.limit < len(rows)
        doc = cut_list({"status": "ok", "by": a.by, "since": since, "rows": page, "total": total,
                        "truncated": False, "next_cursor": cursor(page[-1]) if more and page else None},
                       "rows", self.budget, cursor, minimum=1)
        return Outcome(doc)


def _out(model: type[BaseModel], **fields: Any) -> dict[str, Any]:
    """A result document, checked against its model (so it always matches the tool's output schema)."""
    return model(**fields).model_dump(mode="json")


def _action_payload(a: S.ActionArgs) -> dict[str, Any]:
    payload: dict[str, Any] = {"operation": a.operation, "entity": a.entity, "tool": a.tool, "args": a.args}
    for name in ("based_on_event", "permission_event", "plan_seq"):
        if getattr(a, name) is not None:
            payload[name] = getattr(a, name)
    if a.requires_state is not None:
        payload["requires_state"] = a.requires_state.model_dump(exclude_none=True)
    return payload


def _report(data: dict[str, Any], at: str | None) -> dict[str, Any]:
    return {"report_id": data.get("report_id"), "round": data.get("round"), "status": data.get("status"),
            "by": data.get("by"), "at": at, "body": data.get("body") or "", "body_chars": len(data.get("body") or ""),
            "body_truncated": False, "body_next": None, "artifacts": list(data.get("artifacts") or []),
            "references": list(data.get("references") or []), "diff": data.get("diff")}


def _history(ev: Any) -> dict[str, Any]:
    """One history entry as `taskkernel task show` lists it (a reason cut at HISTORY_REASON_CHARS, with
    ``reason_truncated``: the whole one is in `taskkernel task show`)."""
    entry = history_entry(ev)
    if isinstance(entry.get("reason"), str) and len(entry["reason"]) > HISTORY_REASON_CHARS:
        entry.update(reason=entry["reason"][:HISTORY_REASON_CHARS] + "…", reason_truncated=True)
    return entry


def _fit_task(full: dict[str, Any], a: S.GetTaskArgs, budget: int) -> dict[str, Any]:
    """get_task's answer within ``budget``. First the oldest history entries, children beyond the first and the
    oldest reports are shed (each list keeps a few), then the texts are cut: the one asked for (the task's body,
    or report_id's) gets most of what is left, the others a share, each cut text with the call that reads on."""
    doc, reports = full["task"], full["reports"]
    focus = 0 if a.report_id is None else 1  # 0: the task's body; 1: the (only) report asked for

    def assemble(chars: list[int], history: int, children: int, kept: int) -> dict[str, Any]:
        """``chars[0]`` characters of the task's body, ``chars[1 + i]`` of the i-th report kept (the newest
        ``kept``); the newest ``history`` entries; the first ``children``."""
        out = {**full, "task": {**doc}, "reports": [], "children": full["children"][:children],
               "history": full["history"][len(full["history"]) - history:] if history else [],
               "truncated": history < len(full["history"]) or children < len(full["children"]) or kept < len(reports)}
        if children < len(full["children"]):
            cursor = encode_cursor(full["children"][children - 1]["task_id"], None, None, parent=a.task_id) \
                if children else None
            out["children_next"] = {"tool": "list_tasks",
                                    "arguments": {"parent": a.task_id, **({"cursor": cursor} if cursor else {})}}
        texts = [(None, str(doc.get("body") or ""))] + [(r, r["body"]) for r in reports[len(reports) - kept:]]
        for i, ((report, text), n) in enumerate(zip(texts, chars, strict=True)):
            offset = min(a.body_offset, len(text)) if i == focus else 0
            piece, rest = cut_text(text, offset, n)
            nxt = None if rest is None else {"tool": "get_task", "arguments": {
                "task_id": a.task_id, "body_offset": rest, **({"report_id": report["report_id"]} if report else {})}}
            out["truncated"] = out["truncated"] or rest is not None
            if report is None:
                out["task"]["body"] = piece
                out.update(body_chars=len(text), body_truncated=rest is not None or offset > 0, body_next=nxt)
            else:
                out["reports"].append({**report, "body": piece, "body_truncated": rest is not None or offset > 0,
                                       "body_next": nxt})
        return out

    history, children, kept = len(full["history"]), len(full["children"]), len(reports)
    whole = [len(str(doc.get("body") or ""))] + [len(r["body"]) for r in reports]
    out = assemble(whole, history, children, kept)
    if size(out) <= budget:
        return out
    target = budget * 3 // 5  # the skeleton (no text) must leave room for the texts
    while True:
        skeleton = size(assemble([0] * (1 + kept), history, children, kept))
        if skeleton <= target:
            break
        if history > 3:
            history = max(3, history // 2)
        elif children > 3:
            children = max(3, children // 2)
        elif kept > 1 and focus == 0:
            kept = max(1, kept // 2)
        else:
            break
    frame: dict[str, Any] | None = None
    squeezed = False
    for stage in range(3):  # long lists or strings in the document itself (references, actions, artifacts)
        if skeleton <= target:
            break
        if stage == 1:  # a small budget: only the text asked for is left
            history, children, kept = 0, 0, (0 if focus == 0 else kept)
        frame = assemble([0] * (1 + kept), history, children, kept)
        if stage == 2:  # too small even for the document: its identity fields only
            frame["task"] = {k: v for k, v in frame["task"].items() if k in _TASK_CORE}
        squeezed = squeeze(frame, target, keep=_TEXT_KEYS, rigid=frozenset({"reports"})) or stage > 0
        skeleton = size(frame)

    def build(chars: list[int]) -> dict[str, Any]:
        texts = assemble(chars, history, children, kept)
        return texts if frame is None else fill(frame, texts, squeezed)

    room = max(budget - skeleton, 0)
    share = room * 3 // 5 if kept else room
    chars = [share if i == focus else (room - share) // max(kept, 1) for i in range(1 + kept)]
    chars = [min(c, w) for c, w in zip(chars, [whole[0], *whole[len(whole) - kept:]], strict=True)]
    out = build(chars)
    while size(out) > budget and any(chars):  # escaped characters take more than one byte: shrink until it fits
        chars = [c * 4 // 5 for c in chars]
        out = build(chars)
    if size(out) > budget:  # pragma: no cover - the frame was squeezed to 3/5 of the budget
        squeeze(out, budget, keep=_TEXT_KEYS, rigid=frozenset({"reports"}))
    return out


_TASK_CORE = frozenset({"task_id", "state", "revision", "round", "subject", "body", "parent", "risk_level"})
_TEXT_KEYS = frozenset({"body", "body_next", "children_next", "arguments", "task_id", "report_id"})


def fill(frame: dict[str, Any], texts: dict[str, Any], squeezed: bool) -> dict[str, Any]:
    """``frame`` (squeezed, texts empty) with the texts and their pointers of ``texts`` (the same shape)."""
    out = {**frame, "task": {**frame["task"], "body": texts["task"]["body"]},
           "truncated": squeezed or texts["truncated"]}
    for key in ("body_chars", "body_truncated", "body_next"):
        out[key] = texts[key]
    out["reports"] = [{**r, **{k: t[k] for k in ("body", "body_truncated", "body_next")}}
                      for r, t in zip(frame["reports"], texts["reports"], strict=True)]
    return out


def _inputs_doc(session: str, taken: list[Pending], remaining: int) -> dict[str, Any]:
    return _out(S.ReadInputsOut, status="ok", session=session, remaining=remaining, inputs=[
        {"accept_seq": t.seq, "kind": t.kind, "text": t.text, "text_truncated": False, "question_id": t.question_id,
         "anchor": t.anchor, "by": t.by} for t in taken])


def _cut_to(doc: dict[str, Any], room: int) -> dict[str, Any]:
    """``doc`` of one instruction too long for an answer, its text cut (in characters, as written) to fit ``room``;
    `taskkernel task inputs` shows the whole of it."""
    item = doc["inputs"][0]
    text, low, high = item["text"], 0, len(item["text"])  # the longest prefix that fits lies in [low, high)
    item["text_truncated"] = True
    while high - low > 1:
        mid = (low + high) // 2
        item["text"] = text[:mid]
        low, high = (mid, high) if size(doc) <= room else (low, mid)
    item["text"] = text[:low]
    return doc
