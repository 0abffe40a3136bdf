"""The parts of issue 14 a user meets without running an agent: each CLI's documented output read into usage and
failures, the prompt built from the task, `init --agents` and .gitignore, the configuration's refusals, `up`'s
warning for a role without a runner, and a diff no agent can forge."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from taskkernel.coordinator.agent_profiles import builtin_profiles
from taskkernel.coordinator.runners.ledger import Purpose
from taskkernel.coordinator.runners.presets import ProfileRunner
from taskkernel.coordinator.runners.prompt import acceptance_of, build_prompt, prompt_fields, rework_reason
from tests.cli_support import append_config, new_workspace, run, taskkernel


def runner(name: str) -> ProfileRunner:
    return ProfileRunner(name, builtin_profiles()[name])


# The documented shapes (docs/agents.md), as the CLIs print them.
CLAUDE_OK = json.dumps({"type": "result", "subtype": "success", "is_error": False, "duration_ms": 132,
                        "num_turns": 1, "result": "DONE", "session_id": "s", "total_cost_usd": 0.000489,
                        "usage": {"input_tokens": 100, "cache_creation_input_tokens": 20,
                                  "cache_read_input_tokens": 30, "output_tokens": 7}})
CODEX_STREAM = "\n".join(json.dumps(e) for e in (
    {"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": "DONE"}},
    {"type": "turn.completed", "usage": {"input_tokens": 300, "cached_input_tokens": 90, "output_tokens": 21}},
    {"type": "turn.completed", "usage": {"input_tokens": 5, "cached_input_tokens": 0, "output_tokens": 1}}))
GEMINI_OK = json.dumps({"response": "Paris.", "stats": {"models": {
    "gemini-2.5-pro": {"api": {"totalRequests": 2, "totalErrors": 0, "totalLatencyMs": 5053},
                       "tokens": {"prompt": 24939, "candidates": 20, "total": 25113, "cached": 21263, "thoughts": 154,
                                  "tool": 0}},
    "gemini-2.5-flash": {"tokens": {"prompt": 61, "candidates": 4, "thoughts": 0}}},
    "tools": {"totalCalls": 1}, "files": {"totalLinesAdded": 0, "totalLinesRemoved": 0}}}, indent=2)


def test_each_cli_output_is_read_into_usage_and_cost() -> None:
    claude = runner("claude-code").read("some progress text\n" + CLAUDE_OK + "\n")
    assert claude.usage == {"tokens_in": 150, "tokens_out": 7, "cost_usd": 0.000489} and claude.error is None
    codex = runner("codex").read(CODEX_STREAM)
    assert codex.usage == {"tokens_in": 305, "tokens_out": 22} and codex.error is None
    gemini = runner("gemini-cli").read("Loaded cached credentials.\n" + GEMINI_OK)
    assert gemini.usage == {"tokens_in": 25000, "tokens_out": 178} and gemini.error is None


def test_a_failure_the_cli_reports_in_its_json_is_a_failure() -> None:
    """Claude Code says an API error with subtype "success" and is_error true; Codex with turn.failed."""
    api_error = json.loads(CLAUDE_OK) | {"is_error": True, "result": "API Error: 500 overloaded"}
    said = runner("claude-code").read(json.dumps(api_error))
    assert said.error is not None and "API Error: 500" in said.error and said.usage["cost_usd"] == 0.000489
    failed = runner("codex").read(json.dumps({"type": "turn.failed", "error": {"message": "quota"}}))
    assert failed.error == "codex turn failed: quota"
    assert runner("gemini-cli").read("not json at all").usage == {}
    implausible = json.loads(CLAUDE_OK) | {"total_cost_usd": float("inf"), "usage": {"input_tokens": -3}}
    assert runner("claude-code").read(json.dumps(implausible)).usage == {}


def test_codex_error_lines_a_later_turn_completed_are_transient_retries_not_a_failure() -> None:
    """Codex prints `error` lines while it reconnects, then completes: only an error nothing completed after fails."""
    reconnect = {"type": "error", "message": "Reconnecting... 2/5 (stream disconnected before completion)"}
    done = {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 2}}
    recovered = runner("codex").read("\n".join(json.dumps(e) for e in (reconnect, reconnect, done)))
    assert recovered.error is None and recovered.usage == {"tokens_in": 10, "tokens_out": 2}
    gave_up = runner("codex").read("\n".join(json.dumps(e) for e in (done, reconnect)))
    assert gave_up.error == "codex error: Reconnecting... 2/5 (stream disconnected before completion)"


def test_the_added_clis_outputs_are_read_into_usage_and_failures() -> None:
    """The shapes the real CLIs printed (docs/agents.md): Qwen Code's one JSON array, OpenCode's step_finish
    events, Copilot CLI's usage file, Gemini CLI's error on stderr."""
    qwen = json.dumps([{"type": "system", "subtype": "init"}, {"type": "result", "subtype": "success",
                       "is_error": False, "usage": {"input_tokens": 40, "output_tokens": 5,
                                                    "cache_read_input_tokens": 2}}], indent=2)
    assert runner("qwen-code").read(qwen).usage == {"tokens_in": 42, "tokens_out": 5}
    failed = json.loads(qwen)
    failed[-1] |= {"is_error": True, "subtype": "error_during_execution", "error": {"message": "[API Error: 400]"}}
    assert "[API Error: 400]" in (runner("qwen-code").read(json.dumps(failed)).error or "")
    step = {"type": "step_finish", "part": {"tokens": {"input": 100, "output": 7, "reasoning": 3,
                                                       "cache": {"read": 10, "write": 0}}, "cost": 0.002}}
    error = {"type": "error", "error": {"name": "APIError", "data": {"message": "Too Many Requests"}}}
    opencode = runner("opencode").read("\n".join(json.dumps(e) for e in (step, step)))
    assert opencode.usage == {"tokens_in": 220, "tokens_out": 20, "cost_usd": 0.004} and opencode.error is None
    assert runner("opencode").read(json.dumps(error)).error == "opencode error: Too Many Requests"
    usage = json.dumps({"modelMetrics": {"m": {"usage": {"inputTokens": 9, "outputTokens": 4, "cacheReadTokens": 1,
                                                          "cacheWriteTokens": 0}}}})
    copilot = runner("copilot").read(json.dumps({"type": "result", "exitCode": 0}), "", usage)
    assert copilot.usage == {"tokens_in": 10, "tokens_out": 4} and copilot.error is None
    limited = json.dumps({"type": "session.error", "data": {"errorType": "rate_limit", "message": "429 slow down"}})
    assert runner("copilot").read(limited).error == "copilot error (rate_limit): 429 slow down"
    stderr = 'Error when talking to Gemini API\n{"error": {"code": 400, "message": "API key not valid"}}\n'
    assert runner("gemini-cli").read("", stderr).error == "gemini error: API key not valid"
    retrying = ('Attempt 2 failed with status 429. Retrying with backoff... _ApiError: {"error":{"code":429,'
                '"message":"quota exceeded","status":"RESOURCE_EXHAUSTED"}}\n    at retryWithBackoff (x.js:1)\n')
    assert runner("gemini-cli").read("", retrying).error == "gemini error: 429 RESOURCE_EXHAUSTED: quota exceeded"
    assert runner("gemini-cli").read(GEMINI_OK, retrying).error is None, "a retry that then succeeded is no failure"
    completion = {"type": "completion", "finalText": "done", "usage": {"input_tokens": 30, "output_tokens": 6,
                                                                      "cache_read_input_tokens": 4}}
    assert runner("droid").read(json.dumps(completion)).usage == {"tokens_in": 34, "tokens_out": 6}
    loop = {"type": "error", "source": "agent_loop", "message": "400 model not found"}
    closing = {"type": "error", "source": "cli", "message": "Exec failed"}
    assert runner("droid").read("\n".join(json.dumps(e) for e in (loop, closing))).error == (
        "droid error: 400 model not found"), "the provider's reason, not the CLI's closing words"


def test_the_prompt_is_built_from_the_task_its_parents_its_acceptance_and_why_it_came_back() -> None:
    root = {"task_id": "TASK-20261201-001", "parent": None, "state": "active", "recipient": "PM",
            "subject": "Ship login", "body": "the whole feature"}
    doc = {"task_id": "TASK-20261201-002", "parent": root["task_id"], "state": "active", "recipient": "DEV",
           "subject": "Login form", "round": 2,
           "body": "Build it.\n\n## 3 · 验收标准\n- the form posts\n### detail\n- kept\n## Notes\n- not criteria"}
    assert acceptance_of(doc["body"]) == "- the form posts\n### detail\n- kept"
    history = [("task_claimed", {"round": 1}), ("task_rejected", {"round": 2, "reason": "the form does not post"})]
    assert rework_reason(doc, history) == ("This round is a rework. Round 1 came back because: the form does not "
                                           "post")
    fields = prompt_fields(doc, Purpose.EXECUTE, "DEV", task={root["task_id"]: root}.get, history=history,
                           mcp=False, workdir="/w")
    prompt = build_prompt(None, fields)
    assert "task TASK-20261201-002 (round 2)" in prompt and "# Login form" in prompt
    assert "TASK-20261201-001 (active, PM): Ship login — the whole feature" in prompt
    assert "the form does not post" in prompt and "taskkernel task report TASK-20261201-002" in prompt
    assert build_prompt("{subject} in {workdir}", fields) == "Login form in /w"
    assert rework_reason({**doc, "round": 1}, history) is None


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_init_agents_writes_that_clis_examples_and_keeps_state_out_of_git(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    made = run("init", str(repo), "--agents", "codex", cwd=tmp_path)
    assert made.code == 0 and made.json["gitignored"] is True, made.err
    text = (repo / "taskkernel.toml").read_text()
    assert '\nrunner = "codex"\n' in text and "CODEX_API_KEY" in text and '# model = "gpt-5-codex"' in text
    assert (repo / ".gitignore").read_text() == "/.taskkernel/\n"
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--ignored"], capture_output=True,
                            text=True, check=True).stdout
    assert "!! .taskkernel/" in status
    again = run("init", str(repo), cwd=tmp_path)
    assert again.code == 0 and again.json["gitignored"] is False
    assert (repo / ".gitignore").read_text() == "/.taskkernel/\n", "never added twice"
    plain = run("init", str(tmp_path / "plain"), cwd=tmp_path)
    assert plain.code == 0 and not (tmp_path / "plain" / ".gitignore").exists()
    wrong = run("init", str(tmp_path / "x"), "--agents", "cursor", cwd=tmp_path)
    assert wrong.code == 64 and "claude-code, codex, gemini-cli" in wrong.err


@pytest.mark.parametrize(("table", "expected"), [
    ('runner = "command"\nargv = ["a"]\nmodel = "x"', "model is an agent CLI's option"),
    ('runner = "codex"\nisolation = "shared"\non_approve = "merge"', 'on_approve = "merge" merges a task\'s branch'),
    ('runner = "codex"\nprompt = "do {subjet}"', "{subjet} in \"do {subjet}\" is not a placeholder taskkernel fills; "
                                                 "did you mean {subject}?"),
    ('runner = "gemini-cli"\nisolation = "worktree"\nrun_as = "nobody"', "with run_as is not supported"),
    ('runner = "scripted"\nisolation = "worktree"', "isolation applies to runners that start a program only"),
    ('runner = "command"\nargv = ["a"]\non_approve = "merge"', 'on_approve = "merge" merges a task\'s branch'),
    ('runner = "claude-code"\nrun_as = "nobody"\non_approve = "merge"', 'on_approve = "merge" merges'),
    ('runner = "codex"\nallowed_tools = ["shell"]', "codex has no allowlist of tools"),
    ('runner = "scripted"\nmodel = "x"', "model is an agent CLI's option (a profile's, e.g. "
                                        "claude-code), not one of a scripted runner"),
])
def test_a_preset_table_that_cannot_work_is_refused_when_the_file_loads(tmp_path: Path, table: str,
                                                                      expected: str) -> None:
    ws = new_workspace(tmp_path)
    append_config(ws, f"\n[roles.DEV]\n{table}\n")
    refused = run("task", "list", cwd=ws)
    assert refused.code == 64 and refused.json["code"] == "config_invalid" and expected in refused.err, refused.err


def test_a_worktree_outside_a_git_repository_keeps_up_from_starting(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path)
    append_config(ws, '\n[roles.DEV]\nrunner = "claude-code"\nargv = ["true"]\nisolation = "worktree"\n')
    refused = run("up", "--once", cwd=ws)
    assert refused.code == 64 and refused.json["code"] == "runner_unavailable", refused.err
    assert 'isolation = "worktree" needs the workspace inside a git repository' in refused.err


def test_up_says_once_per_role_that_tasks_wait_for_a_role_without_a_runner(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path)
    for subject in ("one", "two"):
        assert run("task", "create", "--to", "QA", "--subject", subject, cwd=ws).code == 0
    up = taskkernel("up", "--once", cwd=ws)
    assert up.returncode == 0, up.stderr
    warnings = [json.loads(line) for line in up.stderr.splitlines() if "role_without_runner" in line]
    assert [(w["role"], w["waiting"]) for w in warnings] == [("QA", 2)], up.stderr
    assert "add [roles.QA] to taskkernel.toml" in warnings[0]["hint"]


def test_an_agent_cannot_supply_the_diff_itself(tmp_path: Path) -> None:
    """The diff is the coordinator's evidence: a report's payload has no such field, so a forged one is refused."""
    ws = new_workspace(tmp_path)
    task = run("task", "create", "--to", "DEV", "--subject", "s", cwd=ws).json["task_id"]
    assert run("task", "claim", task, cwd=ws).code == 0
    shown = run("task", "show", task, cwd=ws).json
    forged = run("submit", cwd=ws, stdin=json.dumps({
        "type": "submit_report", "task_id": task, "expected_revision": shown["revision"], "round": 1,
        "idempotency_key": "forge", "payload": {"status": "done", "body": "trust me",
                                                "diff": {"files_changed": 0, "range": "a..b"}}}))
    assert forged.json["status"] == "rejected" and forged.json["reason"] == "invalid_command", forged.out
    assert "diff" in forged.json["message"]


def test_a_preset_whose_cli_is_not_installed_keeps_up_from_starting(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path)
    append_config(ws, '\n[roles.DEV]\nrunner = "gemini-cli"\n')
    refused = taskkernel("up", "--once", cwd=ws, env={"PATH": "/usr/bin:/bin"})
    assert refused.returncode == 64 and json.loads(refused.stdout)["code"] == "runner_unavailable", refused.stderr
    assert "'gemini' (the gemini-cli CLI) is not on the agent's PATH" in refused.stderr
    doctor = taskkernel("doctor", "--json", cwd=ws, env={"PATH": "/usr/bin:/bin"})
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["runner DEV"]["status"] == "fail" and "gemini-cli CLI" in checks["runner DEV"]["message"]
