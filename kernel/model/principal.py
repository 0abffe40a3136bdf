"""Who is acting. Always resolved by an adapter from a credential, never read from a payload."""

from __future__ import annotations

from dataclasses import dataclass

ADMIN = "ADMIN"


@dataclass(frozen=True, slots=True)
class Principal:
    role: str
    agent: str
    # A credential may be scoped to one task (and round): the runner's token for its dispatch.
    task_id: str | None = None
    round: int | None = None

    @property
    def id(self) -> str:
        return f"{self.role}:{self.agent}"

    @property
    def is_admin(self) -> bool:
        return self.role == ADMIN


LOCAL_OWNER = Principal(ADMIN, "local-owner")
