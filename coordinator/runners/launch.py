"""Everything a spawned agent is started with, prepared per run (docs/agents.md): where it works (the task's
worktree, or the workspace), its prompt, the MCP configuration that registers the coordinator's own
`taskkernel mcp` with the run's token (read from a private file: no command line or configuration holds the
token), the command line (the preset's, or the owner's argv with placeholders filled) and the environment (the
allowlist, the preset's credential variables, the run's TASKKERNEL_* variables; never the database URL).

The run's files live in its private log folder (0700) and the token file is removed when the run ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from taskkernel.coordinator.config import RunnerSpec
from taskkernel.coordinator.runners.command import agent_env
from taskkernel.coordinator.runners.presets import McpServer, Preset, PromptUnfit, RunFiles, preset_of
from taskkernel.kernel.logging import get_logger
from taskkernel.kernel.private import private_dir, write_private

log = get_logger(__name__)

TOKEN_FILE = "token"
PROMPT_FILE = "prompt.md"
MCP_FILE = "mcp.json"
USAGE_FILE = "usage.json"  # where a CLI that writes its token counts to a file writes them (Copilot CLI)
CONFIG_HOME = "home"  # the per-run configuration folder of a CLI configured through its home (GEMINI_CLI_HOME)


class LaunchProblem(Exception):
    """The run cannot be started as configured: ``retryable`` says whether trying again could help."""

    def __init__(self, message: str, *, retryable: bool, placeholder: bool = False) -> None:
        super().__init__(message)
        self.retryable, self.placeholder = retryable, placeholder


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    workdir: Path
    env: dict[str, str]
    stdin: Path | None  # the prompt, for a CLI that reads it from stdin
    preset: Preset
    token_file: Path
    usage_file: Path | None = None
    resume_session: str | None = None  # the CLI's own conversation it continues

    def cleanup(self) -> None:
        with contextlib.suppress(OSError):
            self.token_file.unlink()


def mcp_server(workspace: Path, token_file: Path) -> McpServer:
    """This coordinator's own interpreter and installation, the workspace named explicitly: a worktree is a
    checkout and may hold its own taskkernel.toml, which must never decide which kernel the agent reaches."""
    # -P: the CLI starts the server in the agent's working folder, which must never shadow the package (a
    # planted taskkernel/ there would otherwise run as the kernel's server, with the run's token)
    return McpServer(sys.executable, ["-P", "-m", "taskkernel", "--workspace", str(workspace), "--token-file",
                                      str(token_file), "mcp"])


def prepare(spec: RunnerSpec, *, run_dir: Path, workdir: Path, workspace: Path, token: str, prompt: str,
            placeholders: dict[str, str], run_vars: dict[str, str], resume_session: str | None = None) -> Launch:
    """Write the run's files into ``run_dir`` and build its command line and environment (``resume_session``: the
    CLI's own conversation to continue, for a profile that can)."""
    preset = preset_of(spec)
    source = {**os.environ, **spec.env}  # a role's own value selects a provider or a cloud as the coordinator's would
    agent = agent_env(spec, {**run_vars, "TASKKERNEL_WORKDIR": str(workdir)}, source,
                      credentials=preset.credentials(source))
    private_dir(run_dir)
    token_file = _write(run_dir / TOKEN_FILE, token + "\n")
    try:
        prompt_file = _write(run_dir / PROMPT_FILE, prompt)
        server = mcp_server(workspace, token_file) if spec.mcp else None
        home = private_dir(run_dir / CONFIG_HOME) if preset.config_home else None
        mcp_config = _write(_config_path(run_dir, home, preset), preset.mcp_config(server, agent).decode("utf-8")) \
            if server else None
        usage_file = run_dir / USAGE_FILE
        usage_file.unlink(missing_ok=True)  # an earlier attempt's figures are not this one's
        files = RunFiles(workdir, prompt_file, mcp_config, server, home, usage_file, resume_session)
        fill = {**placeholders, "prompt_file": str(prompt_file), "mcp_config": str(mcp_config or ""),
                "workdir": str(workdir)}
        if spec.argv:
            try:
                argv = [part.format(**fill) for part in spec.argv]
            except (KeyError, IndexError, ValueError) as exc:
                raise LaunchProblem(f"argv placeholder {exc} is unknown (known: {', '.join(fill)})",
                                    retryable=False, placeholder=True) from None
        else:
            try:
                argv = preset.argv(spec, files, source)
            except PromptUnfit as exc:
                raise LaunchProblem(str(exc), retryable=False) from None
    except BaseException:
        token_file.unlink(missing_ok=True)  # the run never starts: its token file goes now
        raise
    env = {**preset.defaults(), **agent, **preset.env(files)}  # the role's env wins over the profile's defaults
    stdin = prompt_file if preset.prompt_on_stdin else None
    return Launch(argv, workdir, env, stdin, preset, token_file, usage_file, resume_session)


def _config_path(run_dir: Path, home: Path | None, preset: Preset) -> Path:
    """Where the run's MCP configuration goes: in the run's configuration home for a CLI that reads it there
    (its folders made private), else beside the prompt."""
    if home is None or preset.config_home is None:
        return run_dir / MCP_FILE
    path = home / preset.config_home[1]
    private_dir(path.parent)
    return path


def _write(path: Path, text: str) -> Path:
    """A fresh 0600 file (an earlier attempt's copy replaced), never through a symlink."""
    path.unlink(missing_ok=True)
    write_private(path, text.encode("utf-8"))
    return path
