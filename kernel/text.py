"""The one rendering rule for data on a terminal (docs/cli.md, "Data on a terminal"), in the core so every adapter
that prints applies the same one (the CLI's output layer does at every sink): no text from people, agents or files
drives a terminal.

What could drive a terminal or disguise the text around it is written as an escape: C0 controls (ESC starts every
sequence: title, erase, cursor moves, OSC 52 clipboard writes), DEL, C1 controls (U+009B is a one-character CSI)
and the bidi embeddings, overrides and isolates that reorder what is shown (U+202A-U+202E, U+2066-U+2069).
Backslashes stay as they are, so escaping twice changes nothing.
"""

from __future__ import annotations

BIDI = (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
_ESCAPED = ({c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
            | {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"} | {c: f"\\u{c:04x}" for c in BIDI})
_ESCAPED_KEEP_LINES = {c: e for c, e in _ESCAPED.items() if c not in (0x0A, 0x09)}


def terminal_text(text: str, *, lines: bool = False) -> str:
    """``text`` as it may reach a terminal: every character of the rule above written as an escape (``\\x1b``,
    ``\\x9b``, ``\\u202e``; ``\\n``, ``\\r``, ``\\t``). ``lines``: a multi-line text (a body) keeps its newlines
    and tabs."""
    return text.translate(_ESCAPED_KEEP_LINES if lines else _ESCAPED)
