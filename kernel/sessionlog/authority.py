"""Who may write to (and read) a session. Pure rules; the CLI and the adapters apply them.

A session is owned by the principal whose write created it. Grants (``allow``/``revoke``) are ADMIN's
alone: an agent must never be able to grant itself a permission, nor revoke the owner's. The grant
sessions (``admin`` and the gate's configured session) belong to ADMIN; others may add only evidence
there (``observation``, which the gate weighs by the writer's role: a TOOL's read is trusted, anyone
else's is an agent's claim), and an unscoped OPERATOR its instructions. A task-scoped credential (a
run's token) is never ADMIN or OPERATOR, whatever its role, because it is handed to an agent.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from taskkernel.kernel.model.principal import ADMIN, RUN_PREFIX, Principal
from taskkernel.kernel.sessionlog.models import INSTRUCTION_KIND_NAMES, InputKind, SessionLogError, SessionReason

GRANT_KINDS = frozenset({InputKind.ALLOW.value, InputKind.REVOKE.value})
DEFAULT_ADMIN_SESSIONS = frozenset({"admin"})
OPERATOR = "OPERATOR"
EVIDENCE_KIND = InputKind.OBSERVATION.value
IMPORTED_PREFIX = "IMPORTED:"  # accepted_by of an import whose provenance could not be proven


# A session named like a principal (``ROLE:agent``, ``RUN:ROLE:agent@TASK-…``) is that principal's own: the MCP
# server and agents use these names as their default sessions, so nobody else may create one first and lock its
# owner out (an agent squatting another's checkpoint session).
_PROVENANCE_SHAPED = re.compile(rf"(?:{re.escape(RUN_PREFIX)})?[A-Z][A-Z0-9_]*:[^\s:@][^\s]*")


def initial_owner(session: str, principal: Principal, admin_sessions: Collection[str]) -> str:
    """The owner a new session gets: ADMIN for grant sessions; the principal a session is named after (a
    provenance-shaped name); else whoever writes first (a run's credential: its task's runs)."""
    if session in admin_sessions:
        return ADMIN
    return session if _PROVENANCE_SHAPED.fullmatch(session) else principal.provenance


def check_write(session: str, owner: str | None, principal: Principal, kind: str | None,
                admin_sessions: Collection[str]) -> None:
    """Raise ``role_not_authorized`` unless ``principal`` may write ``kind`` (None: bookkeeping such as
    consume or complete-turn) to ``session``, whose current owner is ``owner`` (None: no session yet)."""
    if principal.is_admin:
        return
    if session.startswith(RUN_PREFIX) and (kind is None or kind in INSTRUCTION_KIND_NAMES):
        # A task's run session: instructions are given by those who may instruct the task (`task say`), and
        # consumed by their delivery; a run writing or consuming them itself would give itself orders, or
        # silently drop a person's (kernel/instructions.py)
        raise SessionLogError(SessionReason.NOT_AUTHORIZED, f"{principal.provenance} may not "
                              f"{'consume inputs of' if kind is None else f'accept {kind!r} inputs into'} the run "
                              f"session {session!r}: instructions go through `taskkernel task say`, and are consumed "
                              "when they are delivered")
    if kind in GRANT_KINDS:
        raise SessionLogError(SessionReason.NOT_AUTHORIZED,
                              f"only ADMIN may accept {kind!r} inputs (caller: {principal.id})")
    if session in admin_sessions and (kind == EVIDENCE_KIND or (
            kind is not None and principal.role == OPERATOR and principal.task_id is None)):
        return
    effective = owner or initial_owner(session, principal, admin_sessions)
    if effective != principal.provenance:
        raise SessionLogError(SessionReason.NOT_AUTHORIZED, f"session {session!r} belongs to {effective}; "
                              f"{principal.provenance} may not write to it")


def check_read(session: str, owner: str | None, principal: Principal, admin_sessions: Collection[str]) -> None:
    """Reading a session is its owner's or ADMIN's: inputs may carry instructions and secrets."""
    if principal.is_admin:
        return
    effective = owner or (ADMIN if session in admin_sessions else None)
    if effective is not None and effective != principal.provenance:
        raise SessionLogError(SessionReason.NOT_AUTHORIZED, f"session {session!r} belongs to {effective}; "
                              f"{principal.provenance} may not read it")
