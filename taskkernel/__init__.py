"""taskkernel: one namespace for the event-sourced kernel (`taskkernel.kernel`), its roles
(`taskkernel.roles`), its scheduler (`taskkernel.scheduler`) and the coordinator with its adapters
(`taskkernel.coordinator`). The repository keeps them as top-level folders; this package links them."""

__version__ = "0.1.0"
