"""A retry that continues the CLI's own conversation against one that starts cold (issue 28): what it sends the model.

    python bench/resume.py       # needs `make agent-clis` (the real Claude Code) ; prints one JSON document

The real Claude Code (tests/clis) against the stand-in Anthropic server of tests/model_servers.py, in one run, the
same task twice: its first attempt answers in text and ends without a report (`no_report`), the retry reports
done. **resumed**: the role's default, the retry runs `claude --resume <session>` with the short continuation
prompt; **cold**: `resume_conversation = false`, the retry gets the whole task again with the resume section. For
the retry it reports the bytes of every request's `system` and `messages` the CLI sent the model, and an estimate
of input tokens (bytes / 4: the stand-in answers scripted usage, not a count). A resumed retry carries its first
attempt's conversation (what it said and what its tools answered), which a cold one loses; the figures say what
that costs.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.model_servers import AnthropicServer  # noqa: E402
from tests.real_clis import RealTeam, cli_missing, role  # noqa: E402

BODY = "Count the words of README.md.\n\n" + "Context. " * 400


def retry_bytes(tmp: Path, resume: bool) -> dict[str, int]:
    tmp.mkdir()
    with AnthropicServer() as model:
        table = role("claude-code", max_attempts=2, resume_conversation=resume)
        team = RealTeam(tmp, f"\n[roles.DEV]\n{table}",
                        {"ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-ant-bench-key"})
        task_id = team.task("DEV", "Count the words", BODY)
        model.load([{"text": "I will count them next time."},
                    {"tool": "kernel:report", "args": {"task_id": task_id, "status": "done", "body": "12 words"}},
                    {"tool": "kernel:submit_task", "args": {"task_id": task_id}},
                    {"text": "Reported."}])
        team.up()
        assert team.show(task_id)["state"] == "review", "the retry reported and submitted"
        retry = model.turns()[1:]  # the first attempt asked the model once (it answered in text)
        sent = sum(len(json.dumps({"system": t.body.get("system"), "messages": t.body.get("messages")}))
                   for t in retry)
        first = len(json.dumps(retry[0].body.get("messages")))
    return {"requests": len(retry), "bytes": sent, "first_request_message_bytes": first, "tokens_estimate": sent // 4}


def main() -> int:
    if (missing := cli_missing("claude")) is not None:
        print(json.dumps({"status": "skipped", "reason": missing}))
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        resumed = retry_bytes(Path(tmp) / "resumed", True)
        cold = retry_bytes(Path(tmp) / "cold", False)
    print(json.dumps({"resumed": resumed, "cold": cold, "ratio": round(resumed["bytes"] / cold["bytes"], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
