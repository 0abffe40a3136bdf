"""The `taskkernel` command line: a human rendering on a terminal, JSON for scripts
(coordinator/cli/output.py)."""
