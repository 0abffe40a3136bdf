"""What the coordinator alone records: the merge it did on approval (``task_merged``) or could not do
(``merge_failed``). These are facts about the repository, not requests, so no credential may write them: a caller
from outside the process (CLI `submit`, MCP, the board) is refused at the shape check (``invalid_command``), and
any principal a credential resolved to (a file's, a schedule's, a run's) at the authority check
(``role_not_authorized``). Only a principal built in-process by the coordinator (``Principal.internal``) passes.
"""

from __future__ import annotations

from taskkernel.kernel.model.commands import COORDINATOR_ONLY, Command
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.reasons import KernelError, ReasonCode


def external_refusal(cmd: Command) -> str | None:
    """Why a command from outside the process may not be this (None: it may)."""
    if cmd.type not in COORDINATOR_ONLY:
        return None
    return (f"{cmd.type.value} is recorded by the coordinator alone, when it merges an approved task; "
            "no caller may submit it (`taskkernel task merge ID` retries a merge)")


def check_author(cmd: Command, principal: Principal) -> bool:
    """True when ``cmd`` is a coordinator record its principal may write (its authority is then settled); False
    for any other command. Raises ``role_not_authorized`` for a record from anyone but the coordinator."""
    if cmd.type not in COORDINATOR_ONLY:
        return False
    if not principal.internal:
        raise KernelError(ReasonCode.ROLE_NOT_AUTHORIZED, f"{cmd.type.value} is recorded by the coordinator "
                          f"alone; {principal.id} may not write it")
    return True
