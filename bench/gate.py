"""Execution gate benchmark: verdicts per second on a 100k-event trace indexed once.

    python bench/gate.py            # 100 000 events, 20 000 verdicts
    python bench/gate.py --quick    # smoke run with small sizes

The trace mixes every event kind over 1 000 entities: instructions (some superseding earlier ones), tool
reads (some failed, values changing over time), grants (globs, expiries), revokes and policies; one event in
twenty is an action. The index is built once from the JSONL bytes (that time is reported separately), then
the actions are judged round-robin. Target: >= 2 000 verdicts/s; the ratio printed is measured / target.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from taskkernel.kernel.gate import Gate, GateStatus, TraceIndex  # noqa: E402

TARGET = 2_000  # verdicts per second


def make_trace(n: int, seed: int = 7) -> tuple[bytes, list[str]]:
    rng = random.Random(seed)
    entities = [f"env:e{i}" for i in range(1000)]
    events: list[dict[str, Any]] = [{"id": "p0", "seq": 0, "kind": "policy", "source": "operator",
                                     "protected_operations": ["deploy", "write"]}]
    instr: dict[str, list[str]] = {}
    grants: dict[str, list[str]] = {}
    actions: list[str] = []
    for seq in range(1, n):
        eid, ent = f"e{seq}", rng.choice(entities)
        roll = rng.random()
        if roll < 0.25:
            ev: dict[str, Any] = {"kind": "instruction", "source": rng.choice(["user", "user", "operator", "agent"]),
                                  "entity": ent, "text": f"do step {seq} on {ent}"}
            if instr.get(ent) and rng.random() < 0.1:
                ev["supersedes"] = [rng.choice(instr[ent])]
            instr.setdefault(ent, []).append(eid)
        elif roll < 0.6:
            ev = {"kind": "observation", "source": "tool", "tool": "get_env",
                  "status": rng.choice(["ok", "ok", "ok", "error"]), "entity": ent, "key": "frozen",
                  "value": rng.random() < 0.2}
        elif roll < 0.8:
            ev = {"kind": "permission_grant", "source": rng.choice(["user", "operator", "system", "agent"]),
                  "principal": "agent-1", "entity": rng.choice([ent, "env:*"]), "operation": "deploy"}
            if rng.random() < 0.2:
                ev["expires_seq"] = seq + rng.randint(1, 2 * n)
            grants.setdefault(ent, []).append(eid)
        elif roll < 0.9:
            ev = {"kind": "permission_revoke", "source": "operator", "principal": "agent-1", "entity": ent,
                  "operation": rng.choice(["deploy", "delete"])}
        elif roll < 0.95 or not instr.get(ent):
            ev = {"kind": "observation", "source": "tool", "tool": "ping", "status": "ok", "entity": ent,
                  "key": "latency_ms", "value": rng.randint(1, 50)}
        else:
            ev = {"kind": "action", "principal": "agent-1", "tool": "deploy", "operation": "deploy", "entity": ent,
                  "based_on_event": rng.choice(instr[ent]),
                  "permission_event": rng.choice(grants.get(ent, ["missing"])),
                  "requires_state": {"key": "frozen", "equals": False}}
            actions.append(eid)
        events.append({"id": eid, "seq": seq, **ev})
    return "".join(json.dumps(e) + "\n" for e in events).encode(), actions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--verdicts", type=int, default=20_000)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = ap.parse_args()
    if args.quick:
        args.events, args.verdicts = 5_000, 2_000
    data, actions = make_trace(args.events)

    t0 = time.perf_counter()
    index = TraceIndex.from_bytes(data)
    build = time.perf_counter() - t0
    assert index.problem is None, index.problem

    statuses: dict[str, int] = {}
    t0 = time.perf_counter()
    for i in range(args.verdicts):
        v = Gate.evaluate(index, actions[i % len(actions)])
        statuses[v.status.value] = statuses.get(v.status.value, 0) + 1
    judge = time.perf_counter() - t0

    t0 = time.perf_counter()
    for i in range(args.verdicts):
        Gate.evaluate(index, actions[i % len(actions)]).to_json()
    judge_json = time.perf_counter() - t0

    rate, rate_json = args.verdicts / judge, args.verdicts / judge_json
    result = {"events": args.events, "actions": len(actions), "verdicts": args.verdicts,
              "index_build_s": round(build, 3), "index_events_per_s": round(args.events / build),
              "verdicts_per_s": round(rate), "verdicts_with_json_per_s": round(rate_json),
              "statuses": statuses, "target_verdicts_per_s": TARGET,
              "ratio_vs_target": round(rate / TARGET, 2), "ratio_with_json_vs_target": round(rate_json / TARGET, 2)}
    print(json.dumps(result, indent=2))
    if GateStatus.PASS.value not in statuses:
        print("warning: no action passed; the workload exercises only failure paths", file=sys.stderr)


if __name__ == "__main__":
    main()
