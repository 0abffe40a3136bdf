"""Schema history of task events. Each step is a pure function from version v to v+1."""

from __future__ import annotations

from typing import Any

from taskkernel.kernel.model.task import default_authority
from taskkernel.kernel.store.events import Upcasters


def _task_created_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 (before risk levels and explicit authority): low risk, default main-line/branch authority."""
    out = dict(data)
    out.setdefault("risk_level", "low")
    out.setdefault("authority", default_authority(out["sender"], out["recipient"], {}))
    return out


def _task_created_v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """v2 (before cost policy): standard tier, no budget."""
    return {**data, "cost_tier": data.get("cost_tier", "standard"), "budget": data.get("budget")}


def task_upcasters() -> Upcasters:
    up = Upcasters()
    up.register("task_created", 1, _task_created_v1_to_v2)
    up.register("task_created", 2, _task_created_v2_to_v3)
    return up
