"""``taskkernel gate ...``: check a trace, demo the stale-plan story (docs/gate.md).

Exit codes: 0 only for PASS; 2 for BLOCK or INSUFFICIENT_EVIDENCE (an unreadable or malformed trace
included); 64 for usage errors. Needs no workspace and no database.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from taskkernel.coordinator.cli.common import Exit, emit, fail, show
from taskkernel.coordinator.cli.output import oneline
from taskkernel.kernel.gate import GateStatus, TraceIndex, Verdict, evaluate, review
from taskkernel.kernel.gate.demo import DEMO_TRACE, run_demo
from taskkernel.kernel.gate.hybrid import unreadable

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Execution gate: is this planned action still supported by the trace, now?")

_COLOUR = {GateStatus.PASS: "green", GateStatus.BLOCK: "red", GateStatus.INSUFFICIENT_EVIDENCE: "yellow"}


def _summary(verdict: Verdict) -> Text:
    colour = _COLOUR[verdict.status]
    subject = verdict.action_id or verdict.proposal_id or "?"
    return Text.assemble((verdict.status.value, colour), f" {oneline(subject)}",
                         *(f"\n  {r.code.value} ({r.rule}): {oneline(r.detail)}" for r in verdict.reasons))


def _load_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{path} is not JSON: {exc}"


def _semantic(index: TraceIndex, proposal_path: Path, review_path: Path) -> Verdict:
    proposal, p_err = _load_json(proposal_path)
    rev, r_err = _load_json(review_path)
    if p_err or r_err:
        return unreadable(index, "; ".join(e for e in (p_err, r_err) if e))
    return review(index, proposal, rev)


@app.command("check")
def check(
    trace: Path = typer.Argument(..., help="Trace file (JSONL, one event per line, file order = event order)."),
    action: str | None = typer.Option(None, "--action", help="Action id to judge (default: the last action event)."),
    proposal: Path | None = typer.Option(None, "--proposal", help="Hybrid path: proposal JSON file (needs --review)."),
    review_file: Path | None = typer.Option(None, "--review", help="Hybrid path: review JSON file (needs --proposal)."),
) -> None:
    """Print the verdict JSON; exit 0 only for PASS.

    With --proposal/--review the hybrid proposal is checked; alone, that semantic verdict is printed. With
    --action as well, the action is judged with the admitted proposal's supersessions, and the semantic
    verdict is attached as ``semantic``.
    """
    if (proposal is None) != (review_file is None):
        fail(Exit.USAGE, "--proposal and --review go together")
    index = TraceIndex.from_file(trace)
    if proposal is not None and review_file is not None:
        semantic = _semantic(index, proposal, review_file)
        verdict = (semantic if action is None
                   else evaluate(index, action, admitted=[semantic]).model_copy(update={"semantic": [semantic]}))
    else:
        verdict = evaluate(index, action)
    emit(verdict.to_dict(), generic=False)
    show(_summary(verdict), story=True)
    raise typer.Exit(int(Exit.OK) if verdict.passed else int(Exit.REJECTED))


def _what(ev: dict[str, Any]) -> str:
    """A short description of a demo event for the table."""
    if "text" in ev:
        return str(ev["text"])
    if "key" in ev:
        return f"{ev['key']} = {ev['value']}"
    if ev["kind"] == "policy":
        return "protects " + ", ".join(ev["protected_operations"] + ev.get("protected_entities", []))
    return str(ev.get("tool") or ev.get("operation") or "")


@app.command("demo")
def demo() -> None:
    """A plan made while the environment was staging is blocked after the switch to production; the corrected
    plan passes. On a terminal, a walkthrough; for scripts, JSON verdicts on stdout and the walkthrough on
    stderr."""
    table = Table(title="trace (file order = event order; judged at its end, seq 10)")
    for col in ("seq", "id", "kind", "source", "entity", "what"):
        table.add_column(col)
    for ev in DEMO_TRACE:
        table.add_row(str(ev["seq"]), ev["id"], ev["kind"], ev.get("source") or ev.get("principal", ""),
                      str(ev.get("entity", "")), _what(ev))
    show(table, story=True)
    as_expected = True
    for step, expected, verdict in run_demo():
        as_expected &= verdict.status.value == expected
        emit({"step": step, "expected": expected, "verdict": verdict.to_dict()}, generic=False)
        show(Text(f"{step}: ") + _summary(verdict), story=True)
    if not as_expected:
        fail(Exit.INTERNAL, "the demo verdicts differ from the expected ones")
