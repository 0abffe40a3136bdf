"""Who is acting. Always resolved by an adapter from a credential, never read from a payload."""

from __future__ import annotations

from dataclasses import dataclass, field

ADMIN = "ADMIN"
RUN_PREFIX = "RUN:"


@dataclass(frozen=True, slots=True)
class Principal:
    role: str
    agent: str
    # A credential may be scoped to one task (and round): the runner's token for its dispatch.
    task_id: str | None = None
    round: int | None = None
    # Built in-process by the coordinator for what it alone records (kernel/records.py); never from a credential.
    internal: bool = False
    # ``ROLE:agent``, formed once (a command reads it several times); derived, so not compared, hashed or shown.
    id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", f"{self.role}:{self.agent}")

    @property
    def is_admin(self) -> bool:
        """ADMIN's powers (bypassing role authority, lowering risk, minting credentials) need an unscoped
        credential: a token scoped to one task is handed to an agent, whatever role it names."""
        return self.role == ADMIN and self.task_id is None

    @property
    def provenance(self) -> str:
        """Who a session records as having written an input, and who owns the sessions it creates. A run's
        (task-scoped) credential is recorded as ``RUN:ROLE:agent@TASK``: an agent's source for the gate
        whatever its role, and its sessions are its task's, not every run's of that role."""
        return self.id if self.task_id is None else f"{RUN_PREFIX}{self.id}@{self.task_id}"


LOCAL_OWNER = Principal(ADMIN, "local-owner")
