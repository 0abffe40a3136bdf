"""Effects of authorized actions: the coordinator performs a tool call only after the gate's PASS
was committed as an `action_authorized` event (outbox), and idempotently (tmp + rename)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from taskkernel.coordinator.fcop.errors import FcopError
from taskkernel.coordinator.fcop.safeio import confine, report, rewrite, safe_join
from taskkernel.kernel.commands import EffectRule, TaskCommandKernel

PERFORM_EFFECT = "perform_action"
PERFORM_RULE = EffectRule(PERFORM_EFFECT, frozenset({"action_authorized"}))


class ToolExecutor:
    """Built-in tools: `write_file` (args: path under workspace/, content). Unknown tools fail the effect.

    The project folder is confined, so `workspace/` itself and every folder below it are checked: an
    agent that planted a symlink cannot turn an authorized write into one outside the workspace."""

    def __init__(self, kernel: TaskCommandKernel, workspace: Path) -> None:
        self.kernel = kernel
        self.root = workspace / "workspace"
        confine(workspace)

    def __call__(self, effect_key: str, payload: dict[str, Any]) -> None:
        with self.kernel.db.read() as conn:
            event = self.kernel.store.event_at(conn, payload["global_pos"])
        if event is None:
            raise LookupError(f"event {payload['global_pos']} of effect {effect_key} is missing")
        action = event.data
        tool = getattr(self, f"_tool_{action['tool']}", None)
        if tool is None:
            raise LookupError(f"no built-in tool {action['tool']!r} for action {action['action_id']}")
        tool(action["args"])

    def _tool_write_file(self, args: dict[str, Any]) -> None:
        """Re-running the same authorized write yields the same bytes; a refusal (`path_escape`,
        `symlink_refused`, …) is logged with its path and fails the effect."""
        try:
            target = safe_join(self.root, str(args["path"]))
            rewrite(target, str(args.get("content", "")).encode("utf-8"), expect_sha256=None)
        except FcopError as exc:
            report(exc, "write_file")
            raise
