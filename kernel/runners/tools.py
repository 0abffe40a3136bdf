"""Effects of authorized actions: the coordinator performs a tool call only after the gate's PASS
was committed as an `action_authorized` event (outbox), and idempotently (tmp + rename)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kernel.commands import EffectRule, TaskCommandKernel

PERFORM_EFFECT = "perform_action"
PERFORM_RULE = EffectRule(PERFORM_EFFECT, frozenset({"action_authorized"}))


class ToolExecutor:
    """Built-in tools: `write_file` (args: path under workspace/, content). Unknown tools fail the effect."""

    def __init__(self, kernel: TaskCommandKernel, workspace: Path) -> None:
        self.kernel = kernel
        self.root = (workspace / "workspace").resolve()

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
        target = (self.root / str(args["path"])).resolve()
        if not target.is_relative_to(self.root):
            raise ValueError(f"write_file path {args['path']!r} escapes workspace/")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(str(args.get("content", "")))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)  # re-running the same authorized write yields the same bytes
