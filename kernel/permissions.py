"""Human grants for protected actions, read from the session log at execution time.

Approving a high-risk task (and more for irreversible ones) needs a current `allow` of the
permission named after the command, scoped to the task, in the session log. The permission
reducer folds allow/revoke in acceptance order up to the command's cutoff (the latest
sequence unless the command names `permission_as_of`): a grant revoked later does not
authorize, and a grant accepted after the cutoff does not either. A past permission is not a
present one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskkernel.kernel.model.commands import Command, CommandType
from taskkernel.kernel.model.principal import ADMIN, Principal
from taskkernel.kernel.reasons import KernelError, ReasonCode
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.store.db import UnitOfWork

DEFAULT_SESSION = "admin"
DEFAULT_PROTECTED: Mapping[str, frozenset[CommandType]] = {
    "high": frozenset({CommandType.APPROVE}),
    "irreversible": frozenset({CommandType.APPROVE, CommandType.REOPEN, CommandType.FORCE_ARCHIVE}),
}


def permission_scope(task_id: str) -> str:
    return f"task:{task_id}"


class HumanGrantGuard:
    def __init__(self, log: SessionLog, *, default_session: str = DEFAULT_SESSION,
                 protected: Mapping[str, frozenset[CommandType]] = DEFAULT_PROTECTED) -> None:
        self.log = log
        self.default_session = default_session
        self.protected = protected

    def __call__(self, uow: UnitOfWork, cmd: Command, doc: dict[str, Any] | None, principal: Principal) -> None:
        if doc is None or cmd.type not in self.protected.get(doc["risk_level"], frozenset()):
            return
        session = cmd.permission_session or self.default_session
        scope = permission_scope(doc["task_id"])
        # The grant must hold now; a cutoff named by the command can only add a condition (it must also
        # have held then), never bring back a grant that was revoked since.
        cutoffs = [None] if cmd.permission_as_of is None else [None, cmd.permission_as_of]
        records = self.log.records(session, uow.conn)  # read once, judged at each cutoff
        by_id = {r.input_id: r for r in records}
        why = None
        for as_of in cutoffs:
            decision = self.log.permission_decision(session, cmd.type.value, scope, as_of=as_of, records=records)
            grant = by_id.get(decision.input_id or "")
            if decision.decision == "allow" and (grant is None or (grant.accepted_by or "").split(":", 1)[0] != ADMIN):
                why = f"grant {decision.input_id} was not accepted from ADMIN (a human)"
            elif decision.decision != "allow":
                why = decision.reason or (f"revoked by {decision.input_id} at sequence {decision.seq}"
                                          if decision.seq else "no grant was accepted")
            if why is not None:
                break
        if why is not None:
            cutoff = "the latest input" if cmd.permission_as_of is None else \
                f"the latest input and at sequence {cmd.permission_as_of}"
            raise KernelError(ReasonCode.PERMISSION_REQUIRED,
                              f"{cmd.type.value} on a {doc['risk_level']}-risk task needs a current "
                              f"'{cmd.type.value}' grant for {scope} in session {session!r} as of {cutoff}: "
                              f"{why}")
