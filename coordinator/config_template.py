"""The taskkernel.toml `init` writes: every table and key as a commented example that validates when turned on
(tests/test_config.py), the role examples written for the agent CLI the team uses (`init --agents`)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class AgentExample:
    """What the role examples say for one agent CLI (docs/agents.md has the flags behind each preset)."""

    model: str
    args: str  # a TOML array
    allowed_tools: str  # a TOML array
    credentials: str  # the provider variables the preset passes when the coordinator has them
    argv: str  # a TOML array: a command line of the owner's own, replacing the preset's
    variant: str  # one of the profile's named variants (coordinator/agents.toml)


AGENT_EXAMPLES = {
    "claude-code": AgentExample(
        model='"sonnet"', args='["--max-turns", "40"]', allowed_tools='["Bash(git diff:*)", "Bash(pytest:*)"]',
        credentials="ANTHROPIC_API_KEY or CLAUDE_CODE_OAUTH_TOKEN (or Bedrock/Vertex settings)",
        argv='["claude", "-p", "--output-format", "json", "--permission-mode", "acceptEdits", "--mcp-config", '
             '"{mcp_config}", "--strict-mcp-config", "--allowedTools", "mcp__taskkernel", "--model", "opus"]',
        variant='"plan"'),
    "codex": AgentExample(
        model='"gpt-5-codex"', args='["-c", "model_reasoning_effort=\\"high\\""]', allowed_tools="[]",
        credentials="CODEX_API_KEY or OPENAI_API_KEY (after a `codex login` under CODEX_HOME)",
        argv='["codex", "exec", "--json", "--sandbox", "workspace-write", "--skip-git-repo-check", "--cd", '
             '"{workdir}", "--profile", "team"]', variant='"high"'),
    "gemini-cli": AgentExample(
        model='"gemini-2.5-pro"', args="[]", allowed_tools='["run_shell_command(git diff)"]',
        credentials="GEMINI_API_KEY or GOOGLE_API_KEY (or Vertex AI settings)",
        argv='["gemini", "--output-format", "json", "--approval-mode", "auto_edit", "--skip-trust", '
             '"--allowed-mcp-server-names", "taskkernel", "--model", "gemini-2.5-flash"]', variant='"plan"'),
}
AGENT_CHOICES = tuple(AGENT_EXAMPLES)

TEMPLATE = """\
# taskkernel workspace configuration. Every table and key: docs/config.md.
# `taskkernel doctor` checks this file, the database, the folders and the runners.
# Lines starting with "# [" or "# key =" are examples: remove the "# " to use them.

[kernel]
# "full": fsync every commit (survives kill -9 and power loss); "process": survives kill -9 only.
durability = "full"
# No token means no authority: the owner's CLI reads its credential from .taskkernel/owner.token (0600);
# agents get only their run's scoped token (docs/security.md).
require_token = true
# database = "postgresql+psycopg://user@host/db"   # default: .taskkernel/kernel.db (SQLite, WAL)
# max_runs = 4                               # agent runs at once in this coordinator, all roles together
# shutdown_grace = 30                        # seconds `up` lets running agents finish after Ctrl-C / SIGTERM
{team}
# How each role's agent runs (docs/roles.md, docs/agents.md). A role without a table is not run automatically:
# its tasks wait for a person (`up` says so once per role). `up` refuses a program it cannot find.
#
# A coding agent CLI, run headless: runner = "claude-code", "codex" or "gemini-cli". The preset hands it the
# prompt built from the task, registers the kernel's MCP server with the run's own token, keeps it to its
# working folder and reads usage and cost from its JSON output. Of the coordinator's environment it passes on
# {agent}; never the database URL.
{roles}{role_keys}{other_runners}
# An agent CLI taskkernel ships no profile for (docs/agents.md, "Profiles"): a role's runner = "my-cli" names it.
# [profiles.my-cli]
# program = "my-cli"
# package = "my-cli@1.2.3"                  # where it comes from, for people and `doctor`
# argv = ["run", "--json", "--cwd", "{{workdir}}"]
# prompt = "stdin"                          # or "argv": argv then names {{prompt}} or {{prompt_file}}
# model_argv = ["--model", "{{model}}"]
# reasoning_argv = ["--effort", "{{reasoning}}"]
# sandbox = "edit"                          # its default sandbox or permission mode …
# sandbox_argv = ["--mode", "{{sandbox}}"]  # … and how it is passed
# tools_argv = ["--allow", "{{tools}}"]     # a role's allowed_tools, with kernel_tools
# kernel_tools = "mcp__taskkernel"          # how the allowlist names the kernel's own tools
# mcp_format = "mcpServers"                 # the MCP file's shape: "mcpServers", "servers", "gemini-settings",
#                                           # "opencode", "copilot", "droid-settings", "none"
# mcp_argv = ["--mcp-config", "{{mcp_config}}"]
# mcp_env = "MY_CLI_MCP_CONFIG"             # a variable naming the MCP file
# config_home = "MY_CLI_HOME"               # a variable naming a per-run configuration folder …
# mcp_file = "settings.json"                # … and the MCP file within it
# credential_vars = ["MY_PROVIDER_API_KEY", "MY_PROVIDER_BASE_URL"]
# switched_vars = {{ MY_CLOUD = ["MY_CLOUD", "MY_CLOUD_REGION"] }}   # passed only when the first one is set
# when_set = {{ MY_PROVIDER_BASE_URL = ["--base-url", "{{value}}"] }}  # arguments added when a variable is set
# env = {{ MY_CLI_NO_UPDATE = "1" }}          # fixed variables for every run
# output = "usage-json"                     # the parser: usage-json, claude-result, stream-json, codex-events,
#                                           # gemini-json, opencode-events, copilot-events, droid-events
# resume_argv = ["--resume", "{{session_id}}"]
# variants = {{ fast = {{ model = "small", args = ["--quick"] }} }}

# The execution gate (docs/gate.md): where grants are read and which operations need one.
# [gate]
# session = "admin"
# protected = {{ low = ["write", "delete", "deploy", "force_push", "migrate"], high = ["*"] }}
# roles = {{ DEV = ["deploy"] }}              # operations protected for a role whatever the task's risk

# The FCoP folder adapter (docs/folders.md).
# [folders]
# enabled = true
# submit_on_done_report = true              # a REPORT file with status done also submits the task

# Durable automations (docs/scheduler.md).
# [scheduler]
# max_clock_skew = "1d"                     # how far ahead of the clock a schedule's watermark may stand

# The MCP server, `taskkernel mcp` (docs/mcp.md).
# [mcp]
# output_budget = 16384                     # bytes of one tool result; longer lists and texts are cut, with a pointer

# The web board, `taskkernel serve` (docs/web.md).
# [serve]
# require_login = false                     # true: every page needs a sign-in; required for a --host beyond loopback
# hosts = ["board.example.com"]             # Host names a TLS proxy in front passes on (others are refused)

# What a task's worktree commits (docs/agents.md#what-a-worktree-commits): every file the repository would track,
# less build caches and environments (__pycache__/, .venv/, node_modules/, … : the defaults), whatever git ignores.
# [worktrees]
# exclude = ["build/", "*.log"]             # more untracked files never committed (gitignore patterns)
# drop_defaults = ["*.egg-info/"]           # defaults this repository does commit

# A team across machines on one PostgreSQL store (docs/hosts.md): `up --host buildbox` runs only its roles' agents.
# [hosts.buildbox]
# roles = ["DEV"]                           # the roles whose agents run on this host ([roles.X] tables)
# slots = {{ DEV = 2 }}                     # runs of a role at once here (default: the role's concurrency)
# max_runs = 8                              # runs at once here, all roles (default: [kernel] max_runs)
"""
ROLE_KEYS = """\
# Preset options: the CLI's model, extra arguments for its command line, and tools of its own it may use unasked.
# model = {model}
# variant = {variant}                          # a named variant of the profile: model, reasoning effort, sandbox
# args = {args}
# allowed_tools = {allowed_tools}
# mcp = true                                # false: no MCP server; the prompt teaches the CLI verbs instead
# resume_conversation = true                # a re-run of a task continues the CLI's own conversation
# prompt = "{{subject}}\\n\\n{{body}}\\n\\n{{how_to_report}}"   # default: built from the task (docs/agents.md)
# isolation = "worktree"                    # one git worktree and branch per task (the default in a git repository)
# base_branch = "main"                      # worktrees are cut from it and merged into it (default: checked out)
# on_approve = "merge"                      # merge the task branch into the base on approval ("keep": leave it)
# argv = {argv}
#   replaces the preset's whole command line (the prompt stays on stdin): keep the flags docs/agents.md lists, or
#   add yours with `args` instead;
#   placeholders: {{task_file}} {{task_id}} {{round}} {{workspace}} {{role}} {{purpose}} {{prompt_file}}
#                 {{mcp_config}} {{workdir}}
# cwd = "src"                               # relative to the workspace (or to the task's worktree)
# env = {{ MODEL_HINT = "small" }}            # explicit values added to the agent's environment
# pass_env = ["HTTPS_PROXY"]                # coordinator variables forwarded on purpose
# timeout = 1800                            # seconds; then SIGTERM to the agent's process group
# kill_grace = 10                           # seconds between that SIGTERM and SIGKILL
# heartbeat_timeout = 300                   # stop a silent agent early (heartbeat: docs/runs.md)
# concurrency = 2                           # this role's runs at once (within max_runs)
# non_retryable_exit_codes = [2]            # exit codes that block the task at once, without a retry
# lease = 1860                              # seconds without renewal before another coordinator takes over
# max_attempts = 3                          # then the task gets a blocked report
# backoff = 2.0                             # seconds before attempt n+1: backoff * 2**(n-1)
# agent = "dev-1"                           # recorded as `by` (default: dev-agent)
"""
OTHER_RUNNERS = """\
#
# Any program: runner = "command" with argv (the same placeholders).
# [roles.QA]
# runner = "command"
# argv = ["my-agent", "--task", "{{task_file}}"]
# run_as = "agent-qa"                       # start the agent as this OS user (the coordinator: root or that user)
#
# [roles.OPS]
# runner = "scripted"                       # the built-in agent, or the role package's handler
"""
TEAM_EXAMPLE = """
# The team, when the FCoP folder has no fcop.json (which takes precedence).
# [team]
# name = "dev-team"
# leader = "PM"
# roles = ["PM", "DEV", "QA", "OPS"]
"""


@dataclass(frozen=True)
class AgentTeam:
    """The team `init --agents` writes a runner for: its leader and roles, and whether the workspace is in a git
    repository (then every role works in its own worktree and an approval merges its branch)."""

    leader: str
    roles: list[str]
    git: bool


def config_template(database: str | None = None, team: str | None = None, agents: str | None = None,
                    agent_team: AgentTeam | None = None) -> str:
    """The commented taskkernel.toml `init` writes: every table, with examples that validate when uncommented.
    ``database``: the URL to name in [kernel]; ``team``: a [team] table to write instead of its example;
    ``agents``: the agent CLI the role examples use (one of AGENT_CHOICES; default claude-code); with
    ``agent_team`` (`init --agents`) each of its roles gets a table running that CLI, so `up` runs the team as
    soon as the CLI is on PATH (role_tables)."""
    runner = agents or "claude-code"
    example = AGENT_EXAMPLES[runner]
    fields = {"runner": runner, "argv": example.argv, "model": example.model, "args": example.args,
              "allowed_tools": example.allowed_tools, "variant": example.variant}
    if agent_team is None:
        roles, keys = f'# [roles.DEV]\n# runner = "{runner}"\n', ROLE_KEYS
        others = OTHER_RUNNERS
    else:
        roles, set_keys = role_tables(runner, agent_team)
        keys = "#\n# More keys, for any of the tables above:\n" + "".join(
            line + "\n" for line in ROLE_KEYS.splitlines() if line.removeprefix("# ").split(" = ")[0] not in set_keys)
        others = OTHER_RUNNERS.replace("[roles.QA]", "[roles.<ROLE>]").replace("[roles.OPS]", "[roles.<ROLE>]")
    text = TEMPLATE.format(team=team if team is not None else TEAM_EXAMPLE, agent=example.credentials,
                           roles=roles, role_keys=keys.format(**fields), other_runners=others.format(**fields))
    if database is not None:
        text = text.replace('# database = "postgresql+psycopg://user@host/db"', f"database = {json.dumps(database)}")
    return text


AGENT_TIMEOUT = 1800  # seconds: a coding agent's task often takes longer than the default 600


def role_tables(runner: str, team: AgentTeam) -> tuple[str, set[str]]:
    """A ``[roles.<ROLE>]`` table running ``runner`` for the leader and for every other role of ``team``, and the
    keys they set. The leader breaks work down and reviews the tasks it hands out (a task's done authority is
    who created it); a task a person creates waits for that person's approval. In a git repository each task has
    its worktree and an approval merges the reviewed commit into the base branch."""
    keys = {"runner": json.dumps(runner), "timeout": str(AGENT_TIMEOUT),
            **({"on_approve": '"merge"'} if team.git else {})}
    body = "".join(f"{k} = {v}\n" for k, v in keys.items())
    merge = ("# Each task works in its own git worktree; an approval merges the reviewed commit into the base "
             "branch.\n" if team.git else "# Outside a git repository every run works in the workspace itself (no "
             "worktree, no merge).\n")
    head = (f"# The team runs on {runner} (`init --agents {runner}`): one table per role.\n{merge}"
            f"# The leader, {team.leader}, breaks work down and reviews the tasks it hands out; a task a person "
            "creates\n# waits for that person's approval (`taskkernel inbox`, `task approve`).\n")
    order = [team.leader, *(r for r in team.roles if r != team.leader)]
    return head + "\n".join(f"[roles.{role}]\n{body}" for role in order), set(keys)
