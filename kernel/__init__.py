"""taskkernel: the event-sourced kernel core (store, command kernel, session log, gate)."""
