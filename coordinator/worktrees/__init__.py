"""One git worktree and branch per task (docs/agents.md): created for the task's first run, reused by later rounds
and by a crashed run's retry, diffed into the done report, merged into the base on approval, removed on archive."""
