"""The docs stand alone: README.md and docs/*.md link and refer only to files in this repository, and those files
(and the headings their `#anchors` name) exist.

What is checked, per document:
- every Markdown link (`[text](target)`, `![alt](src)`, `[label]: target`, `<scheme:…>` autolinks, `href`/`src`
  attributes): no URL scheme (a reader of a checkout has nothing but the checkout), no absolute path, no `..`
  leaving the repository; a relative target must exist, and its `#anchor` must be a heading of the target
  (GitHub's slug rules) or an `id`/`name` attribute in it;
- every path a document mentions in an inline code span or in prose: a path starting with `../` must stay inside
  the repository and exist; a path whose first part is a top-level entry of the repository (`docs/`, `tests/`,
  `kernel/`, …, `Makefile`) must exist (a glob must match); a source path (`x/y.py`; a layer-relative one such as
  `folders/ingest.py` counts) and a document name like ours (`codeflowmu-kernel.md`) must be a file of the
  repository;
- no section sign (`§`): every section of these docs is reachable by a link, so a `§` only ever points into a
  document the reader does not have.

Names that are not repository paths are left alone: FCoP workspace paths (`_lifecycle/inbox/`, `reports/`, the
workspace root `docs/agents/`), envelope file names (`TASK-….md`), names with placeholders (`<name>`, `…`,
`{a,b}`, `NNNN_what.py`, `YYYYMMDD`), absolute and `./` paths (examples such as `/etc/passwd`) and glob
patterns outside the repository's own folders.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_DIRS = {"build", "node_modules", "__pycache__"}  # and every dot folder but .ci, and *.egg-info
# A path into an FCoP project, not into this repository: the workspace root fcop also looks for.
WORKSPACE_PATHS = ("docs/agents",)
FILE_SUFFIXES = (".md", ".py", ".toml", ".txt", ".json", ".yml", ".yaml", ".sh", ".cfg", ".ini")
ENVELOPE_PREFIXES = ("TASK-", "REPORT-", "ISSUE-", "REVIEW-")
# `<name>`, `…`, `{a,b}`, and upper-case stand-ins such as `NNNN_what.py` or `YYYYMMDD`
PLACEHOLDER = re.compile(r"[<>…{}\s]|\.\.\.|(?<![A-Za-z])(?:N{3,}|X{3,}|YYYY(?:MMDD)?)(?![A-Za-z])")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)"
                         r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
AUTOLINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.-]*:[^<>\s]*)>")
HTML_ATTR = re.compile(r"""\b(href|src)\s*=\s*["']([^"']*)["']""", re.I)
HTML_ANCHOR = re.compile(r"""<[a-zA-Z][^>]*\b(?:id|name)\s*=\s*["']([^"']+)["']""")
SECTION_SIGN = "§"
# a path-like word in prose: at least one slash between name characters, or a file name with a known suffix
PROSE_PATH = re.compile(r"(?<![\w./:@-])((?:\.{1,2}/)*[\w.-]+(?:/[\w.*-]+)+/?|[\w-][\w.-]*\.(?:md|py|toml))(?![\w/])")


@dataclass(frozen=True)
class Problem:
    doc: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.what}"


@dataclass(frozen=True)
class Doc:
    """A document split for checking: its prose lines (code spans kept as they are, fenced blocks blanked) and
    its headings' anchors."""

    path: Path
    prose: tuple[str, ...]
    anchors: frozenset[str]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@cache
def repo_files() -> tuple[frozenset[str], frozenset[str]]:
    """Every file and folder of the checkout (relative POSIX paths), without VCS, venv and build output."""
    files, dirs = set(), set()
    for folder, subdirs, names in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in SKIP_DIRS and not d.endswith(".egg-info")
                      and (not d.startswith(".") or d == ".ci")]
        here = Path(folder).relative_to(ROOT)
        dirs |= {(here / d).as_posix() for d in subdirs}
        files |= {(here / n).as_posix() for n in names}
    return frozenset(files), frozenset(dirs)


def top_level() -> set[str]:
    files, dirs = repo_files()
    return {p for p in files | dirs if "/" not in p and not p.startswith(".") or p == ".ci"}


def github_slug(text: str) -> str:
    """GitHub's heading anchor (github-slugger): the rendered text, lower-cased, every character that is not a
    letter, mark, number, connector punctuation (`_`), space or hyphen dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML renders as nothing
    out = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in " -" or cat[0] in "LMN" or cat == "Pc":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def split_doc(path: Path, text: str) -> Doc:
    """The document at ``path`` with this text: fenced blocks blanked out, headings turned into anchors."""
    lines = text.splitlines()
    prose: list[str] = []
    slugs: list[str] = []
    fence: str | None = None
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip(fence[0]).strip():
                fence = None
            prose.append("")
            continue
        if m:
            fence = m.group(1)
            prose.append("")
            continue
        prose.append(line)
        if h := ATX.match(line):
            slugs.append(github_slug(h.group(2) or ""))
        elif SETEXT.match(line) and i and prose[i - 1].strip() and not ATX.match(prose[i - 1]) \
                and not prose[i - 1].lstrip().startswith(("|", "-", "*", ">")):
            slugs.append(github_slug(prose[i - 1].strip()))
    anchors, seen = set(), {}
    for slug in slugs:  # a repeated heading gets -1, -2, … (GitHub)
        n = seen.get(slug, 0)
        anchors.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    anchors |= {a for line in prose for a in HTML_ANCHOR.findall(line)}
    return Doc(path, tuple(prose), frozenset(anchors))


@cache
def load(path: Path) -> Doc:
    return split_doc(path, path.read_text(encoding="utf-8"))


def blocks(doc: Doc) -> Iterator[tuple[int, str]]:
    """(first line, text) of each run of non-blank prose lines: a paragraph, a list, a table. A link or a code
    span may wrap onto the next line, never past a blank one."""
    start, lines = 0, []
    for n, line in enumerate([*doc.prose, ""], 1):
        if line.strip():
            start = start or n
            lines.append(line)
        elif lines:
            yield start, "\n".join(lines)
            start, lines = 0, []


def blanked(pattern: re.Pattern[str], text: str) -> str:
    """``text`` with every match of ``pattern`` blanked out, offsets and line breaks kept."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def links(doc: Doc) -> list[tuple[int, str]]:
    """(line, target) of every link outside code."""
    out = []
    for start, block in blocks(doc):
        text = blanked(CODE_SPAN, block)
        found = [(m.start(), m.group(1)) for m in INLINE_LINK.finditer(text)]
        found += [(m.start(), m.group(1)) for m in AUTOLINK.finditer(text)]
        found += [(m.start(), m.group(2)) for m in HTML_ATTR.finditer(text)]
        found += [(m.start(), m.group(1)) for m in REF_DEF.finditer(text)]
        out += [(start + text.count("\n", 0, pos), t[1:-1] if t.startswith("<") and t.endswith(">") else t)
                for pos, t in found]
    return out


def inside(target: Path) -> bool:
    try:
        target.resolve().relative_to(ROOT)
    except ValueError:
        return False
    return True


def check_link(doc: Doc, target: str) -> str | None:
    """Why a link target is not a file (and heading) of this repository, or None."""
    if SCHEME.match(target) or target.startswith("//"):
        return f"link {target!r} leaves the repository (the docs must stand alone)"
    path_part, _, anchor = target.partition("#")
    path_part = unquote(path_part.split("?", 1)[0])
    if path_part.startswith("/"):
        return f"link {target!r} is an absolute path"
    if not path_part:
        ok = unquote(anchor) in doc.anchors
        return None if ok else f"link {target!r}: this document has no heading with the anchor #{anchor}"
    dest = doc.path.parent / path_part
    if not inside(dest):
        return f"link {target!r} leaves the repository"
    if not dest.exists():
        return f"link {target!r}: {rel(dest.resolve())} does not exist"
    if anchor:
        if dest.suffix != ".md" or dest.is_dir():
            return f"link {target!r}: an anchor into a file that is not Markdown"
        if unquote(anchor) not in load(dest).anchors:
            return f"link {target!r}: {rel(dest)} has no heading with the anchor #{anchor}"
    return None


def path_mentions(doc: Doc) -> list[tuple[int, str]]:
    """(line, text) of every path-like mention: the words of inline code spans, and path-like words in prose."""
    out = []
    for start, block in blocks(doc):
        for m in CODE_SPAN.finditer(block):
            line = start + block.count("\n", 0, m.start())
            # a command line or a list of names: each word on its own (`python bench/gate.py`, `a/ b/`)
            out += [(line, w.rstrip(",;:)").lstrip("(")) for w in m.group(2).split()]
        text = blanked(INLINE_LINK, blanked(CODE_SPAN, block))
        out += [(start + text.count("\n", 0, m.start()), m.group(1)) for m in PROSE_PATH.finditer(text)]
    return out


def looks_like_path(word: str) -> bool:
    return bool(re.fullmatch(r"[\w.*/-]+", word)) and ("/" in word or word.endswith(FILE_SUFFIXES)) \
        and not SCHEME.match(word) and not re.fullmatch(r"[\d/.-]+", word)


def check_path(doc: Doc, word: str) -> str | None:
    """Why a mentioned path is not in this repository, or None (also None when it is no repository path)."""
    if not looks_like_path(word) or PLACEHOLDER.search(word):
        return None
    files, dirs = repo_files()
    name = word.rstrip("/")
    if word.startswith("../"):
        dest = doc.path.parent / word
        if not inside(dest):
            return f"path {word!r} leaves the repository"
        return None if dest.exists() else f"path {word!r}: {rel(dest.resolve())} does not exist"
    if word.startswith(("/", "./")) or PurePosixPath(name).name.startswith(ENVELOPE_PREFIXES):
        return None  # an absolute or `./` path is an example (`/etc/passwd`, `./a.py`), an envelope an FCoP file
    first = name.split("/", 1)[0]
    if first in top_level() and not name.startswith(WORKSPACE_PATHS):
        if "*" in name:
            return None if any(PurePosixPath(f).match(name) for f in files) else f"path {word!r} matches no file"
        return None if name in files | dirs else f"path {word!r} does not exist in the repository"
    if name.endswith(".py") and "/" in name or re.fullmatch(r"[a-z]+(?:-[a-z]+)*\.md", name):
        # a source path (a layer-relative one such as `folders/ingest.py` counts; a bare `a.py` may be an example
        # entity), or a document named like ours (`codeflowmu-kernel.md`; a name with digits, such as
        # `role-switch-20260115.md`, is an example of a workspace file)
        if any(f == name or f.endswith("/" + name) for f in files):
            return None
        return f"{word!r} names no file of the repository"
    return None


def problems(doc: Doc) -> list[Problem]:
    found, where = [], rel(doc.path)
    for n, target in links(doc):
        if why := check_link(doc, target):
            found.append(Problem(where, n, why))
    for n, word in path_mentions(doc):
        if why := check_path(doc, word):
            found.append(Problem(where, n, why))
    for n, line in enumerate(doc.prose, 1):
        if SECTION_SIGN in line:
            found.append(Problem(where, n, f"a section sign points into a document outside the repository: "
                                               f"{line.strip()[:100]!r}"))
    return sorted(set(found), key=lambda p: (p.line, p.what))


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_doc_links_and_paths_stay_in_the_repository(path: Path) -> None:
    found = problems(load(path))
    assert not found, "\n".join(map(str, found))


# --- the checker itself: each rule catches what it is there for ---------------------------------------------


def _doc(text: str) -> list[str]:
    """Problems of a document with this text, as if it were docs/_probe.md."""
    return [p.what for p in problems(split_doc(ROOT / "docs" / "_probe.md", text))]


@pytest.mark.parametrize("text, expected", [
    ("See [the digest](../../shared/reference/fcop-protocol.md).", "leaves the repository"),
    ("See [it](../shared/reference/fcop-protocol.md).", "does not exist"),
    ("See [it](/work/shared/x.md).", "absolute path"),
    ("See [fcop](https://pypi.org/project/fcop/).", "leaves the repository"),
    ("See <https://example.org/>.", "leaves the repository"),
    ('See <a href="../../x.md">x</a>.', "leaves the repository"),
    ("[x]: ../../outside.md\n\nSee [x].", "leaves the repository"),
    ("See [folders](folders.md#no-such-heading).", "no heading with the anchor #no-such-heading"),
    ("See [folders](nosuch.md).", "does not exist"),
    ("See [here](#nowhere).\n\n# Somewhere", "#nowhere"),
    ("Background: `../shared/reference/fcop-protocol.md`.", "does not exist"),
    ("Background: `../../shared/reference/fcop-protocol.md`.", "leaves the repository"),
    ("Background: ../../shared/reference/fcop-protocol.md.", "leaves the repository"),
    ("Tested in `tests/test_no_such_file.py`.", "does not exist in the repository"),
    ("See docs/nosuch.md for more.", "does not exist in the repository"),
    ("Run `python bench/nosuch.py`.", "does not exist in the repository"),
    ("The loops of `codeflowmu-kernel.md`.", "names no file of the repository"),
    ("As the protocol digest §3 says.", "section sign"),
    ("A link whose [text\nwraps](../../outside.md) onto the next line.", "leaves the repository"),
    ("A link whose target [wraps](\n../../outside.md).", "leaves the repository"),
    ("A code span that `wraps onto\ntests/test_no_such_file.py` the next line.", "does not exist in the repository"),
])
def test_the_checker_flags(text: str, expected: str) -> None:
    found = _doc(text)
    assert any(expected in what for what in found), found


def test_a_problem_names_its_line() -> None:
    found = problems(split_doc(ROOT / "docs" / "_probe.md", "# Title\n\nText [a link\nthat wraps](nosuch.md).\n"))
    assert [(p.doc, p.line) for p in found] == [("docs/_probe.md", 3)]


@pytest.mark.parametrize("text", [
    "See [fcop](fcop.md#transitions-we-write) and [the layout](folders.md#symlinks-refused-everywhere).",
    "See [the errors](fcop.md#error-codes-fcopreason-stable-values) and "
    "[up](cli.md#taskkernel-up-workspace---once---once-wait-s).",
    "See [here](#somewhere).\n\n## Somewhere",
    "Twice: [a](#same-1).\n\n## Same\n\n## Same",
    "An anchor: [a](#set-aside). <a id=\"set-aside\"></a>",
    "Files: `_lifecycle/inbox/`, `reports/`, `docs/agents/`, `TASK-20260101-001-PM-to-DEV.md`, `<root>/.locks/`.",
    "Code: `coordinator/fcop/filenames.py`, `folders/ingest.py`, `tests/test_fcop_*.py`, `python bench/gate.py`.",
    "Not a link: `[x](../../outside.md)`.",
    "A new file: `coordinator/migrations/versions/NNNN_what.py`, `tests/test_YYYYMMDD.py`.",
    "```\n[x](../../outside.md) `../../y.md` §1\n```",
    "A ghost: `role-switch-20260115.md`. Examples: `/etc/passwd`, `fcop.json`, `taskkernel.toml`, "
    "`ledger/views/PM.todo.md`, `Europe/Berlin`.",
])
def test_the_checker_accepts(text: str) -> None:
    assert _doc(text) == []


@pytest.mark.parametrize("heading, slug", [
    ("Write rules (`safeio`)", "write-rules-safeio"),
    ("Error codes (`FcopReason`, stable values)", "error-codes-fcopreason-stable-values"),
    ("`taskkernel schedule …`", "taskkernel-schedule-"),
    ("Import: history in, once", "import-history-in-once"),
    ("The chain key: back it up", "the-chain-key-back-it-up"),
    ("`taskkernel up [WORKSPACE] [--once]`", "taskkernel-up-workspace---once"),
    ("G2 → G3 [the docs](x.md)", "g2--g3-the-docs"),
])
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug
