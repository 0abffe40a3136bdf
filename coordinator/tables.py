"""The coordinator's tables (SQLAlchemy Core), all of them: the run ledger and what the folder adapter knows about
each file and each imported FCoP root.

Like kernel/store/schema.py, kernel/sessionlog/tables.py and scheduler/tables.py, this is the one place these
tables are defined; a change here is a new migration in coordinator/migrations/ (docs/migrations.md).
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# Run ledger (runners/ledger.py): one row per agent wake-up, claimed under a lease with a fencing token.
runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("task_id", sa.Text, nullable=False),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("purpose", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("fencing", sa.Integer, nullable=False, server_default="0"),
    sa.Column("lease_owner", sa.Text),
    sa.Column("lease_until", sa.Text),
    sa.Column("not_before", sa.Text, nullable=False),
    sa.Column("exit_code", sa.Integer),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("ended_at", sa.Text),
    # What the holder started, cleared when it ends the run: a takeover must find a crashed holder's agent.
    sa.Column("token_hash", sa.Text),  # SHA-256 of the run's token, to revoke it as stale_lease
    sa.Column("agent_host", sa.Text),  # host and boot: a pid means nothing on another machine or after a reboot
    sa.Column("agent_pgid", sa.Integer),
    sa.Column("agent_start", sa.BigInteger),  # /proc/<pid>/stat field 22: tells a recycled pid apart
    sa.Column("error_code", sa.Text),  # why the last attempt failed, a stable code (docs/runs.md)
    sa.Column("heartbeat_at", sa.Text),  # the agent's own last heartbeat (heartbeat_timeout counts from it)
    sa.Index("ix_runs_due", "state", "not_before"),
    sa.Index("ix_runs_created", "created_at", "run_id"),  # runs list: newest first, keyset pages
    sa.Index("ix_runs_task", "task_id"),  # runs list --task
)

# What the adapter knows about each file (folders/tracking.py): the version it last ingested or wrote, for which task.
folder_files = sa.Table(
    "folder_files",
    metadata,
    sa.Column("rel", sa.Text, primary_key=True),
    sa.Column("sha256", sa.Text, nullable=False),
    sa.Column("task_id", sa.Text),
    sa.Column("origin", sa.Text, nullable=False),
    sa.Column("note", sa.Text),
    sa.Column("updated_at", sa.Text, nullable=False),
    sa.Index("ix_folder_files_task", "task_id"),
)

# Other ids a task is known by: the TASK-<32 hex> id its file got when `taskkernel fcop migrate --to g4` wrote the
# task into an FCoP 4 workspace (fcop's Core names each task anew); the kernel keeps its own id and its history.
# Its own MetaData, as worktrees': what creates the tables above when missing keeps working on an older database.
alias_metadata = sa.MetaData()
task_aliases = sa.Table(
    "task_aliases",
    alias_metadata,
    sa.Column("alias", sa.Text, primary_key=True),
    sa.Column("task_id", sa.Text, nullable=False),
    sa.Column("source", sa.Text, nullable=False),  # what gave it, e.g. "fcop4-migrate"
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Index("ix_task_aliases_task", "task_id"),
)

# What the live scanner had handled when a process stopped: a file whose stat is unchanged is not read again.
folder_stats = sa.Table(
    "folder_stats",
    metadata,
    sa.Column("rel", sa.Text, primary_key=True),
    sa.Column("stat", sa.Text, nullable=False),  # "size:mtime_ns:inode:ctime_ns"
    sa.Column("sha256", sa.Text, nullable=False),
)

# FCoP roots already imported as history (folders/importer.py): one import each.
folder_imports = sa.Table(
    "folder_imports",
    metadata,
    sa.Column("root", sa.Text, primary_key=True),  # the FCoP root, relative to the workspace
    sa.Column("generation", sa.Text, nullable=False),
    sa.Column("imported_at", sa.Text, nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
)

# One git worktree and branch per task (worktrees/manager.py): where it is, what it was cut from, where it stands.
# Its own MetaData: the components that create the tables above when missing (the run ledger, the folder
# adapter) must keep working on a database from before this table (a read such as `verify` never needs it).
worktree_metadata = sa.MetaData()
worktrees = sa.Table(
    "worktrees",
    worktree_metadata,
    sa.Column("task_id", sa.Text, primary_key=True),
    sa.Column("path", sa.Text, nullable=False),  # absolute: the agent's working folder
    sa.Column("branch", sa.Text, nullable=False),  # task/<TASK-ID>
    # git's administrative folder of the worktree, read when it was created: every git command on the worktree
    # names it, never trusting the `.git` file inside the worktree (the agent can rewrite that file)
    sa.Column("git_dir", sa.Text, nullable=False),
    sa.Column("base_branch", sa.Text, nullable=False),  # the branch its diff and merge are against
    sa.Column("base_commit", sa.Text, nullable=False),  # the base's head when the worktree was cut
    sa.Column("state", sa.Text, nullable=False),  # active | merged | archived
    sa.Column("merged_commit", sa.Text),  # the base's head after the merge
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Text, nullable=False),
)

# People in the loop of a running agent (runners/live.py, runners/inputs.py). Their own MetaData, as worktrees':
# what creates the tables above keeps working on a database from before these.
loop_metadata = sa.MetaData()

# What a running agent's streamed output said, typed (assistant text, tool call, tool result, usage, error), redacted
# and bounded per run: `runs follow`, `task watch`, the board's live pane and MCP get_task read it.
run_events = sa.Table(
    "run_events",
    loop_metadata,
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("n", sa.Integer, primary_key=True),  # 1, 2, … per run, in the order the agent printed them
    sa.Column("task_id", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("at", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("tool", sa.Text),
    sa.Column("text", sa.Text, nullable=False),
    sa.Index("ix_run_events_task", "task_id", "at", "run_id", "n"),  # a task's events in the order they were read
)

# Which run an instruction a person (or a leader) gave a task's agent was delivered to, and how (its prompt, or a
# tool result's pending-inputs notice). Consumed is the session log's own counter (last_consumed_seq).
input_deliveries = sa.Table(
    "input_deliveries",
    loop_metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("task_id", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("via", sa.Text, nullable=False),  # prompt | tool
    sa.Column("delivered_at", sa.Text, nullable=False),
)

# A person asked the running agent of a task to stop (`task interrupt`): the coordinator holding the run stops it
# (TERM, grace, KILL) and a resumed run follows.
run_interrupts = sa.Table(
    "run_interrupts",
    loop_metadata,
    sa.Column("task_id", sa.Text, primary_key=True),
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("attempt", sa.Integer, primary_key=True),  # the attempt running when it was asked: only that one stops
    sa.Column("requested_by", sa.Text, nullable=False),
    sa.Column("requested_at", sa.Text, nullable=False),
    sa.Column("message_seq", sa.Integer),  # the instruction accepted with it, if any
    sa.Column("handled_at", sa.Text),
)

# The agent CLI's own conversation of a task's runs by a role (its session id, as the CLI printed it): the next run
# of that role on the task resumes it (Claude Code `--resume`, …) instead of starting cold (runners/inputs.py).
agent_sessions = sa.Table(
    "agent_sessions",
    loop_metadata,
    sa.Column("task_id", sa.Text, primary_key=True),
    sa.Column("role", sa.Text, primary_key=True),
    sa.Column("runner", sa.Text, nullable=False),  # the profile that printed it: another CLI cannot resume it
    sa.Column("session_id", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("recorded_at", sa.Text, nullable=False),
)

# The board's sign-ins (web/auth.py), shared by every `serve` on the store: any server answers a person signed in
# on another, and a restart signs no one out. A cookie is known by its SHA-256 alone and stands for the SHA-256 of
# the credential it signed in with: reading this table gives neither a cookie nor a token.
sign_in_metadata = sa.MetaData()

sign_ins = sa.Table(
    "sign_ins",
    sign_in_metadata,
    sa.Column("sid_hash", sa.Text, primary_key=True),
    sa.Column("token_hash", sa.Text, nullable=False),
    sa.Column("principal", sa.Text, nullable=False),  # Principal.provenance: whose sign-ins are bounded together
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("expires_at", sa.Text, nullable=False),
    sa.Index("ix_sign_ins_principal", "principal", "created_at"),
    sa.Index("ix_sign_ins_expires", "expires_at"),
)

# The team's machines on one store (coordinator/hosts.py, docs/hosts.md): each coordinator's last heartbeat, what it
# serves, for `taskkernel hosts` and the board. A row per host name, kept when the host stops (listed not live).
host_metadata = sa.MetaData()

hosts = sa.Table(
    "hosts",
    host_metadata,
    sa.Column("name", sa.Text, primary_key=True),  # `up --host NAME`, else the machine's name
    sa.Column("owner", sa.Text, nullable=False),  # NAME:pid, the lease owner its runs carry
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("roles", sa.Text, nullable=False),  # JSON: the roles it runs agents for; null: every role
    sa.Column("slots", sa.Text, nullable=False),  # JSON: role -> runs at once there
    sa.Column("max_runs", sa.Integer, nullable=False),
    sa.Column("version", sa.Text, nullable=False),
    sa.Column("started_at", sa.Text, nullable=False),
    sa.Column("heartbeat_at", sa.Text, nullable=False),
)
