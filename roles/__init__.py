"""Role modules: what each role may do. Built-ins plus third-party packages (entry points `taskkernel.roles`)."""

from taskkernel.roles.protocol import RoleSpec
from taskkernel.roles.registry import RoleRegistry

__all__ = ["RoleRegistry", "RoleSpec"]
