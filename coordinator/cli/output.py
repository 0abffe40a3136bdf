"""One output layer for every command (docs/cli.md, "Output").

On a terminal, people get a human rendering on stdout: tables, colours, one-line summaries. When stdout is
not a terminal, or with ``--json``, stdout carries exactly one JSON document per result (or JSON lines for
streams) and the human lines go to stderr, without tables. Data is never read as markup: every string is
printed as the characters it holds (a subject ``[/b]`` is ``[/b]``), and never drives the terminal: one rule
(``terminal_text``) writes control characters, C1 controls and bidi overrides as escapes, and every sink here
(``say``, ``warn``, ``show``, ``safe``, the JSON writers) applies it, so no command can forget it. Errors have one
envelope, ``{"status": "error", "code", "message"}``; refusals keep ``{"status": "rejected", "reason", "message"}``.

rich is imported only when something is rendered for a person: scripts pay for JSON alone.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from enum import IntEnum
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from taskkernel.kernel.text import BIDI, terminal_text

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

Part = str | tuple[str, str]  # plain text, or (text, rich style)
Render = Callable[[Any], None]


class Exit(IntEnum):
    """Process exit codes (docs/cli.md). 64/65 follow sysexits.h."""

    OK = 0
    INTERNAL = 1  # also: an infrastructure fault (database unreachable, disk full, …)
    REJECTED = 2  # also: replay unknown, verify found a break, gate BLOCK, doctor unhealthy
    USAGE = 64
    DATAERR = 65


_json_forced = False
_consoles: dict[str, Console] = {}


def force_json(value: bool = True) -> None:
    """``--json`` (anywhere on the command line): JSON on stdout even on a terminal."""
    global _json_forced
    _json_forced = _json_forced or value


def json_mode() -> bool:
    return _json_forced or not sys.stdout.isatty()


def json_asked() -> bool:
    """``--json`` was given: a command whose pipe output is raw data (`task diff`) answers in JSON only then."""
    return _json_forced


def human_mode() -> bool:
    return not json_mode()


def _console(stream: str) -> Console:
    if stream not in _consoles:
        from rich.console import Console

        _consoles[stream] = Console(stderr=stream == "stderr", markup=False, highlight=False, emoji=False)
    return _consoles[stream]


def people() -> Console:
    """Where lines for people go: stdout in human mode, stderr when stdout carries JSON."""
    return _console("stdout" if human_mode() else "stderr")


# The terminal rule (kernel/text.py) inside a JSON document: json.dumps(ensure_ascii=False) escapes C0 only; DEL,
# C1 and bidi go out as \uXXXX, the same value for a JSON reader (they can occur only inside strings).
_JSON_ESCAPED = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0), *BIDI)}


def oneline(text: str) -> str:
    """Data shown inside a line for people: the terminal rule, newlines included, so a subject can neither
    break the line nor drive the terminal."""
    return terminal_text(text)


def json_safe(text: str) -> str:
    """A JSON text whose DEL, C1 and bidi characters are written as ``\\uXXXX``: the same document for a parser,
    inert on a terminal."""
    return text.translate(_JSON_ESCAPED)


def dumps(obj: Any) -> str:
    """One JSON document on one line, as every command writes it (data as itself, ``json_safe``)."""
    return json_safe(json.dumps(obj, ensure_ascii=False, default=str))


class _Safe:
    """A renderable whose text segments pass the terminal rule after layout: the last line of defence for data
    a command put into a table or view without ``oneline`` (rich lays such a character out as zero-width, so the
    row may then be wider, but the terminal is never driven). Control segments are rich's own (Live's cursor
    moves) and styles are applied after rendering, so colours stay."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: Any) -> Any:
        from rich.segment import Segment

        for seg in console.render(self.renderable, options):
            yield seg if seg.control else Segment(terminal_text(seg.text, lines=True), seg.style, seg.control)


def safe(renderable: RenderableType) -> RenderableType:
    """``renderable`` under the terminal rule (``show`` applies it; the live view of `up` uses it directly)."""
    return _Safe(renderable)


def _safe_parts(parts: Iterable[Part]) -> list[Part]:
    return [terminal_text(p, lines=True) if isinstance(p, str) else (terminal_text(p[0], lines=True), p[1])
            for p in parts]


def _line(stream: str, parts: Iterable[Part]) -> None:
    """One line on ``stream`` under the terminal rule (stderr may be a terminal while stdout is a pipe): styled on
    a terminal, plain text (no rich import) for a script."""
    file = sys.stdout if stream == "stdout" else sys.stderr
    safe_parts = _safe_parts(parts)
    if not file.isatty():
        file.write("".join(p if isinstance(p, str) else p[0] for p in safe_parts) + "\n")
        file.flush()
        return
    from rich.text import Text

    _console(stream).print(Text.assemble(*safe_parts), soft_wrap=True)  # one line: the terminal wraps it, so a
    # long token (a cursor, a path) copies back whole


def say(*parts: Part) -> None:
    """One line for people (stdout in human mode, stderr when stdout carries JSON). Plain strings print
    exactly as they are, ``(text, style)`` pairs styled."""
    _line("stdout" if human_mode() else "stderr", parts)


def warn(*parts: Part) -> None:
    """A warning or an error line: always on stderr, whatever the mode."""
    _line("stderr", parts)


def show(renderable: RenderableType, *, story: bool = False) -> None:
    """A table or rule for people: on stdout in human mode. With JSON on stdout it is dropped (a table no
    script reads is only cost), unless it is part of a ``story`` (the demo), which then goes to stderr."""
    if human_mode() or story:
        people().print(safe(renderable))


def write_json(obj: Any) -> None:
    sys.stdout.write(dumps(obj) + "\n")
    sys.stdout.flush()


def emit(obj: Any, render: Render | None = None, *, generic: bool = True) -> None:
    """A command's result. JSON mode: the document on stdout. Human mode: ``render(obj)`` when given, else
    a generic table of the document, or nothing when ``generic`` is False (the command's ``say`` lines
    are its human rendering)."""
    if json_mode():
        write_json(obj)
    elif render is not None:
        render(obj)
    elif generic:
        show(table_of(obj))


def report_error(code: str, message: str, **extra: Any) -> None:
    """The error envelope on stdout in JSON mode, and one readable line on stderr."""
    if json_mode():
        write_json({"status": "error", "code": code, "message": message, **extra})
    warn(("error:", "red"), " ", oneline(message))  # one line, whatever the message quotes


def report_rejection(reason: str, message: str, **extra: Any) -> None:
    """The refusal envelope (reason code) on stdout in JSON mode, and one readable line on stderr."""
    if json_mode():
        write_json({"status": "rejected", "reason": reason, "message": message, **extra})
    warn(("rejected", "red"), f" {reason}: {oneline(message)}")


def fail(code: Exit, message: str, *, error: str | None = None, **extra: Any) -> NoReturn:
    """An error, then exit ``code``. ``error`` is the stable error code (default: the exit code's name,
    e.g. ``usage``)."""
    report_error(error or code.name.lower(), message, **extra)
    raise typer.Exit(int(code))


def reject(reason: str, message: str, **extra: Any) -> NoReturn:
    """A refusal the caller can act on, then exit 2."""
    report_rejection(reason, message, **extra)
    raise typer.Exit(int(Exit.REJECTED))


def cell(value: Any) -> str:
    """A value as one table cell, on one line under the terminal rule: a string as itself (``oneline``), a
    structure as compact JSON (its escapes: ``\\u001b``)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return oneline(value)
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    return json_safe(json.dumps(value, ensure_ascii=False, default=str, separators=(", ", ": ")))  # JSON escapes


def table_of(obj: Any, title: str | None = None) -> RenderableType:
    """A generic human rendering: a list of records as a table (one column per key), a record as key/value
    rows, anything else as its text. Every cell is a Text, so data is never markup."""
    from rich.table import Table
    from rich.text import Text

    if isinstance(obj, list) and obj and all(isinstance(r, dict) for r in obj):
        keys: list[str] = []
        for row in obj:
            keys.extend(k for k in row if k not in keys)
        table = Table(*(oneline(k) for k in keys), title=title)
        for row in obj:
            table.add_row(*(Text(cell(row.get(k))) for k in keys))
        return table
    if isinstance(obj, dict):
        table = Table(show_header=False, box=None, title=title)
        table.add_column(style="bold")
        table.add_column()
        for key, value in obj.items():
            table.add_row(Text(oneline(str(key))), Text(cell(value)))
        return table
    if isinstance(obj, list) and not obj:
        return Text("(none)")
    return Text(cell(obj))
