"""The role registry: team roles from fcop.json, built-ins, and installed third-party role packages.

Third-party packages register a zero-argument factory returning a RoleSpec under the
entry-point group ``taskkernel.roles`` (docs/roles.md).
"""

from __future__ import annotations

from importlib.metadata import entry_points

from taskkernel.kernel.logging import get_logger
from taskkernel.roles import builtin
from taskkernel.roles.protocol import RoleSpec, least_privilege

ENTRY_POINT_GROUP = "taskkernel.roles"
log = get_logger(__name__)


class RoleRegistry:
    def __init__(self, leader: str, roles: dict[str, RoleSpec]) -> None:
        self.leader = leader
        self._roles = dict(roles)

    @classmethod
    def for_team(cls, leader: str, role_codes: list[str], *, load_plugins: bool = True) -> RoleRegistry:
        roles: dict[str, RoleSpec] = {"ADMIN": builtin.admin()}
        for code in role_codes:
            roles[code] = (builtin.leader(code) if code == leader
                           else builtin.worker(code, builtin.WORKER_DESCRIPTIONS.get(code, "worker")))
        if load_plugins:
            for spec in discover_plugins():
                roles[spec.code] = spec
        return cls(leader, roles)

    def get(self, code: str) -> RoleSpec:
        return self._roles.get(code) or least_privilege(code)

    def known(self, code: str) -> bool:
        return code in self._roles

    def codes(self) -> list[str]:
        return sorted(self._roles)


def discover_plugins() -> list[RoleSpec]:
    """Load every installed role package; a broken plugin is logged and skipped, never fatal."""
    specs: list[RoleSpec] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = ep.load()()
            if not isinstance(spec, RoleSpec):
                raise TypeError(f"factory returned {type(spec).__name__}, not RoleSpec")
            specs.append(spec)
        except Exception as exc:  # noqa: BLE001 - third-party code must not take the kernel down
            log.warning("role_plugin_failed", entry_point=ep.name, error=str(exc))
    return specs
