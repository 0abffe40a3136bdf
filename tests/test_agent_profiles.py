"""Agent CLIs as data (issue 26 item 4): the built-in profiles validate as a user's would, a role picks a named
variant, a variable the provider documents adds its arguments, and a `[profiles.<name>]` table of taskkernel.toml
runs a CLI taskkernel ships nothing for, its mistakes refused with their line when the file loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskkernel.coordinator.agent_profiles import builtin_profiles
from taskkernel.coordinator.config import parse_config
from taskkernel.coordinator.config_tables import AgentProfile
from taskkernel.coordinator.runners.launch import LaunchProblem, prepare
from taskkernel.coordinator.runners.presets import McpServer, RunFiles, preset_of
from tests.agents_support import Team, git, role
from tests.cli_support import append_config, new_workspace, run

SHIPPED = ("claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "copilot", "amp", "droid")


def spec_of(text: str, name: str = "DEV"):  # type: ignore[no-untyped-def]
    return parse_config(text).roles[name]


def files(tmp_path: Path, server: bool = True) -> RunFiles:
    prompt = tmp_path / "prompt.md"
    prompt.write_text("do the task")
    return RunFiles(tmp_path, prompt, tmp_path / "mcp.json" if server else None,
                    McpServer("/py", ["-m", "taskkernel", "mcp"]) if server else None)


def test_every_shipped_profile_is_data_the_user_model_accepts() -> None:
    shipped = builtin_profiles()
    assert set(SHIPPED) <= set(shipped), sorted(shipped)
    for name, profile in shipped.items():
        again = AgentProfile.model_validate(profile.model_dump(mode="json", exclude_defaults=True))
        assert again == profile, name
        assert profile.package and "@" in profile.package[1:], f"{name}: the pinned package is named"


def test_a_variant_sets_model_reasoning_and_sandbox_and_a_role_model_wins(tmp_path: Path) -> None:
    high = spec_of('[roles.DEV]\nrunner = "codex"\nvariant = "high"\n')
    argv = preset_of(high).argv(high, files(tmp_path), {})
    assert argv[argv.index("--sandbox") + 1] == "workspace-write"
    assert 'model_reasoning_effort="high"' in argv
    read_only = spec_of('[roles.DEV]\nrunner = "codex"\nvariant = "read-only"\nmodel = "gpt-x"\n')
    argv = preset_of(read_only).argv(read_only, files(tmp_path), {})
    assert argv[argv.index("--sandbox") + 1] == "read-only" and argv[-2:] == ["--model", "gpt-x"]
    plan = spec_of('[roles.DEV]\nrunner = "claude-code"\nvariant = "plan"\n')
    argv = preset_of(plan).argv(plan, files(tmp_path), {})
    assert argv[argv.index("--permission-mode") + 1] == "plan"


def test_codex_with_a_base_url_gets_a_provider_of_its_own_over_https(tmp_path: Path) -> None:
    spec = spec_of('[roles.DEV]\nrunner = "codex"\n')
    plain = preset_of(spec).argv(spec, files(tmp_path), {})
    assert not any("model_provider" in a for a in plain)
    argv = preset_of(spec).argv(spec, files(tmp_path), {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    assert 'model_provider="taskkernel-openai"' in argv
    assert 'model_providers.taskkernel-openai.base_url="http://127.0.0.1:9/v1"' in argv
    assert 'model_providers.taskkernel-openai.wire_api="responses"' in argv
    assert preset_of(spec).credentials({"OPENAI_BASE_URL": "u", "OPENAI_API_KEY": "k", "AWS_REGION": "x"}) == (
        "OPENAI_API_KEY", "OPENAI_BASE_URL")


@pytest.mark.parametrize(("table", "expected"), [
    ('[profiles.my-cli]\nprogram = "my-cli"\nmcp_argv = ["--mcp", "{mcp_config}"]\nretries = 3\n',
     "[profiles.my-cli] in taskkernel.toml, line 7: retries is not a key taskkernel knows"),
    ('[profiles.my-cli]\nprogram = "my-cli"\nargv = ["--in", "{promptfile}"]\nmcp_argv = ["{mcp_config}"]\n',
     "[profiles.my-cli] in taskkernel.toml, line 6: argv: {promptfile} in \"{promptfile}\" is not filled here"),
    ('[profiles.my-cli]\nprogram = "my-cli"\nprompt = "argv"\nmcp_argv = ["{mcp_config}"]\n',
     'prompt = "argv": name {prompt} or {prompt_file} in argv'),
    ('[profiles.my-cli]\nprogram = "my-cli"\n', "the MCP configuration must reach the CLI"),
    ('[profiles.my-cli]\nprogram = "my-cli"\nmcp_argv = ["{mcp_config}"]\noutput = "xml"\n', "output must be"),
    ('[profiles.my-cli]\nprogram = "my-cli"\nmcp_argv = ["{mcp_config}"]\n[profiles.my-cli.variants.fast]\n'
     'modle = "x"\n', "[profiles.my-cli.variants.fast] in taskkernel.toml, line 8: modle is not a key taskkernel "
     "knows; did you mean model?"),
    ('[profiles.my-cli]\nprogram = "my-cli"\nmcp_argv = ["{mcp_config}"]\ncredential_vars = ["TASKKERNEL_TOKEN"]\n',
     "line 7: credential_vars: 'TASKKERNEL_TOKEN' is not a variable a profile may name"),
    ('[profiles.my-cli]\nprogram = "my-cli"\nargv = ["{workdir!r}"]\nmcp_argv = ["{mcp_config}"]\n',
     "placeholders take no conversion or format spec"),
    ('[profiles.my-cli]\nprogram = "my-cli"\nconfig_home = "MY_HOME"\nmcp_file = "/home/u/.my/settings.json"\n',
     "a path inside the run's configuration home (relative, no ..)"),
    ('[roles.DEV]\nrunner = "codx"\n', 'runner = "codx" is not a runner taskkernel knows'),
    ('[roles.DEV]\nrunner = "codex"\nvariant = "hihg"\n', 'variant = "hihg" is not a variant of codex (high, '
     'read-only); did you mean "high"?'),
    ('[roles.DEV]\nrunner = "codex"\nallowed_tools = ["shell"]\n', "codex has no allowlist of tools"),
])
def test_a_profile_or_a_role_that_cannot_work_is_refused_with_its_line(tmp_path: Path, table: str,
                                                                       expected: str) -> None:
    ws = new_workspace(tmp_path)
    text = (ws / "taskkernel.toml").read_text()
    (ws / "taskkernel.toml").write_text("\n\n\n" + table + "\n" + text)  # the table's lines: 4 onwards
    refused = run("task", "list", cwd=ws)
    assert refused.code == 64 and refused.json["code"] == "config_invalid", refused.err
    assert expected in refused.err, refused.err


def test_a_profile_of_the_users_own_runs_its_cli_end_to_end(tmp_path: Path) -> None:
    """A CLI shaped like Claude Code's, declared in taskkernel.toml, under a name taskkernel does not ship: the
    stand-in checks its flags, finds the MCP server where the profile put it, edits, reports."""
    team = Team(tmp_path, "")
    append_config(team.root, """
[profiles.house-agent]
program = "claude"
argv = ["-p", "--output-format", "json"]
sandbox = "acceptEdits"
sandbox_argv = ["--permission-mode", "{sandbox}"]
mcp_argv = ["--mcp-config", "{mcp_config}"]
credential_vars = ["HOUSE_KEY"]
env = { HOUSE_MODE = "ci" }
output = "claude-result"

[profiles.house-agent.variants.careful]
args = ["--max-turns", "3"]

[roles.DEV]
""" + role("house-agent", variant="careful"))
    git(team.root, "commit", "-qam", "house agent")
    task = team.task("DEV", "House", "write house.txt built by the house agent")
    team.up(env={"HOUSE_KEY": "k", "OTHER_SECRET": "s"})
    [record] = team.runs_of(task)
    assert record["argv"][:5] == ["-p", "--output-format", "json", "--permission-mode", "acceptEdits"]
    assert record["argv"][-2:] == ["--max-turns", "3"]
    assert record["env"]["HOUSE_KEY"] == "k" and record["env"]["HOUSE_MODE"] == "ci"
    assert "OTHER_SECRET" not in record["env"]
    doc = team.show(task)
    assert doc["state"] == "review", doc
    assert doc["reports"][0]["diff"]["files"] == [{"path": "house.txt", "insertions": 1, "deletions": 0}]
    checks = {c["name"]: c for c in json.loads(team.cli("doctor", "--json", env={"HOUSE_KEY": ""}).stdout)["checks"]}
    assert checks["runner DEV"]["status"] == "warn" and "HOUSE_KEY" in checks["runner DEV"]["message"]


def launched(tmp_path: Path, table: str, prompt: str = "do the task"):  # type: ignore[no-untyped-def]
    return prepare(spec_of(table), run_dir=tmp_path / "run", workdir=tmp_path, workspace=tmp_path, token="tk_x",
                   prompt=prompt, placeholders={}, run_vars={"TASKKERNEL_TOKEN": "tk_x"})


def test_a_roles_env_selects_the_provider_and_wins_over_the_profiles_defaults(tmp_path: Path) -> None:
    """A base URL in the role's env sets Codex's provider as one in the coordinator's would; a cloud switched on in
    the role's env passes that cloud's credentials; the profile's fixed variables give way to the role's."""
    codex = launched(tmp_path, '[roles.DEV]\nrunner = "codex"\nenv = { OPENAI_BASE_URL = "http://127.0.0.1:9/v1" }\n')
    assert 'model_providers.taskkernel-openai.base_url="http://127.0.0.1:9/v1"' in codex.argv
    claude = launched(tmp_path, '[roles.DEV]\nrunner = "claude-code"\nenv = { DISABLE_TELEMETRY = "0" }\n')
    assert claude.env["DISABLE_TELEMETRY"] == "0" and claude.env["DISABLE_AUTOUPDATER"] == "1"
    assert claude.env["TASKKERNEL_TOKEN"] == "tk_x"


def test_a_prompt_too_long_for_an_argument_is_refused_before_the_cli_starts(tmp_path: Path) -> None:
    """Copilot CLI takes its prompt as an argument (at most 128 KiB on Linux): a longer task body is a clear,
    non-retryable refusal, not a spawn failure retried until the task blocks."""
    assert launched(tmp_path, '[roles.DEV]\nrunner = "copilot"\n', "short").argv[1:3] == ["-p", "short"]
    with pytest.raises(LaunchProblem) as refused:
        launched(tmp_path, '[roles.DEV]\nrunner = "copilot"\n', "x" * (200 << 10))
    assert not refused.value.retryable and "at most 100 KiB" in str(refused.value)


@pytest.mark.parametrize("output", ['{"type":"turn.failed","error":"x"}', "[" * 5000 + "]" * 5000,
                                    '{"usage": {"tokens_in": ' + "9" * 5000 + "}}", '{"type": "result", "usage": [1]}'])
def test_output_no_parser_foresaw_reads_as_saying_nothing_and_never_raises(output: str) -> None:
    """A 5,000-digit number, nesting deeper than the stack, a string where an object was: no figures, no crash
    (a parser that raised would turn a finished run into internal_error)."""
    for name in builtin_profiles():
        preset = preset_of(spec_of(f'[roles.DEV]\nrunner = "{name}"\n'))
        said = preset.read(output, output, output)
        assert said.usage == {}, (name, said)
    assert preset_of(spec_of('[roles.DEV]\nrunner = "codex"\n')).read(output).error == (
        "codex turn failed: x" if "turn.failed" in output else None)
