"""The lines of a recorded patch as the task page shows them, each with its kind and the line of the change it stands
for (its anchor, ``PATH:LINE``: what an inline comment on it is about, as `taskkernel task say --at` takes it).

The file is the one the ``+++ b/PATH`` header names (git's quoting undone); the line is the new file's, counted
from each ``@@ -a,b +c,d @@`` hunk: a context or added line is the new line it is. A removed line has no line of
the new file: it anchors to the new line that takes its place, the next one of its hunk, or, when no new line
follows in the hunk (lines removed at the end of the file), the line before it. The lines of a deleted or emptied
file, and the headers, are not commentable (no anchor). A hunk ends when its counts are used up, so a removed line
that reads ``--- …`` is never taken for a header.
"""

from __future__ import annotations

import codecs
import re
from typing import Any

from taskkernel.coordinator.runners.inputs import ANCHOR

HUNK = re.compile(r"@@ -\d+(?:,(?P<old>\d+))? \+(?P<start>\d+)(?:,(?P<new>\d+))? @@")


def patch_lines(text: str) -> list[dict[str, Any]]:
    """Each line of ``text`` (a git patch) as ``{"text", "kind", "anchor"}``: ``kind`` one of ``file`` (the
    ``---``/``+++`` headers), ``hunk``, ``add``, ``del``, ``context`` and ``note`` (another header, ``\\ No
    newline…``); ``anchor`` ``PATH:LINE`` or None."""
    out: list[dict[str, Any]] = []
    path: str | None = None
    old_left = new_left = line = 0  # what the current hunk still holds; the new file's line number next
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for raw in lines:
        row = raw.removesuffix("\r")
        kind, at = "note", None
        if old_left or new_left:
            tag = row[:1]
            if tag == "+" and new_left:
                kind, at, line, new_left = "add", line, line + 1, new_left - 1
            elif tag == "-" and old_left:
                kind, at, old_left = "del", line if new_left else line - 1, old_left - 1
            elif tag in (" ", "") and old_left and new_left:
                kind, at, line, old_left, new_left = "context", line, line + 1, old_left - 1, new_left - 1
            elif tag != "\\":  # not what the hunk's counts announced: it is cut short, this is a header
                old_left = new_left = 0
        if not (old_left or new_left) and kind == "note":
            if row.startswith("diff --git "):
                path = None
            elif row.startswith("+++ "):
                kind, path = "file", new_path(row[4:])
            elif row.startswith("--- "):
                kind = "file"
            elif hunk := HUNK.match(row):
                kind = "hunk"
                old_left, new_left = int(hunk["old"] or 1), int(hunk["new"] or 1)
                line = int(hunk["start"]) + (new_left == 0)  # an empty new side names the line before it
        out.append({"text": row, "kind": kind, "anchor": anchor(path, at)})
    return out


def new_path(header: str) -> str | None:
    """The path a ``+++`` header names (git's ``b/`` prefix, quoting and the tab after a name with a space
    undone); None for ``/dev/null`` (a deleted file)."""
    name = header.removesuffix("\t")
    if len(name) > 1 and name.startswith('"') and name.endswith('"'):  # C-quoted: octal escapes for UTF-8 bytes
        name = codecs.escape_decode(name[1:-1].encode("utf-8"))[0].decode("utf-8", errors="replace")
    if name == "/dev/null":
        return None
    return name.removeprefix("b/")


def anchor(path: str | None, line: int | None) -> str | None:
    """``PATH:LINE`` as an instruction takes it, or None (no file, no line, or one it could not name)."""
    if path is None or line is None or line < 1:
        return None
    text = f"{path}:{line}"
    return text if ANCHOR.fullmatch(text) else None
