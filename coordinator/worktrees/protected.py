"""The coordinator's own files in a workspace, which no task's change may touch (docs/security.md).

An agent edits its worktree, a checkout of the whole repository: what it writes there is committed as its work
and, on approval, merged into the base checkout the coordinator runs in. Were its change to hold
``.taskkernel/owner.token``, ``chain.key``, a TASK file under the FCoP root or ``taskkernel.toml``, one
approval would hand the agent the owner's credential or let it speak as ADMIN through a file. So these paths are
never part of a task's change, whatever the agent's ``.gitignore`` says: the evidence step leaves them out and
says so in the report (``Worktrees.evidence``), and the merge refuses a range that touches them
(``Worktrees.merge``). The ignore rules that hide the private folder are the coordinator's too: a change to a
``.gitignore`` between the repository's root and the workspace that removes a line naming one of these paths, or
adds a negation (``!…``, which can re-include them), is left out as a whole, and so is a change to a
``.gitattributes`` beside one that adds an attribute rewriting what a checkout writes (an encoding, a filter, line
endings).

The agent CLIs' own project configuration (``.claude/``, ``.gemini/``, ``opencode.json``, … at the repository's
root and at every folder down to the workspace: where the CLIs look) is the owner's too: such a file can name
the MCP server, hooks or plugins a CLI runs, so one planted by an agent would run its code in the next run in the
same worktree (a review, a rework, a retry). It is never part of a change, and ``Worktrees.ensure`` puts it back
as the task's commit has it before every run.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from taskkernel.coordinator.fcop.detect import CONFIG_NAME as FCOP_CONFIG
from taskkernel.coordinator.fcop.detect import G2_MARKERS, LIFECYCLE_DIR, FcopError, find_workspace_root

ENVELOPE_FOLDERS = ("reports", "reviews", "issues", "history", "shared")  # besides tasks/ and log/ (G2)

STATE_DIR = ".taskkernel"
WORKTREES_DIR = "worktrees"  # under STATE_DIR: one checkout per task, the agents' files (not private state)
SCRATCH_INDEX = ".index-"  # a scratch index beside the checkouts while a change is rebuilt (manager.py)
CONFIG_FILE = "taskkernel.toml"
IGNORE_FILE = ".gitignore"
ATTRIBUTES_FILE = ".gitattributes"
# Attributes that change the bytes a checkout writes: on the ignore files they could re-encode or rewrite the owner's
# .gitignore when a change merges (``working-tree-encoding=UTF-16`` hides every rule from git).
REWRITING = ("working-tree-encoding", "filter", "eol", "text", "crlf", "ident")

# Why a path is the coordinator's (the ``reason`` a report lists with each path left out).
PRIVATE_STATE = "private_state"  # .taskkernel/: database, owner token, chain key, run logs, worktrees
FCOP_FILES = "fcop_files"  # the FCoP root: a file there acts as the role it names
WORKSPACE_CONFIG = "workspace_config"  # taskkernel.toml: database URL, runners, gate
IGNORE_RULES = "ignore_rules"  # a .gitignore change that could stop hiding the above
AGENT_CONFIG = "agent_config"  # an agent CLI's project configuration: MCP servers, hooks, plugins it would run
# Where the agent CLIs read project configuration that can start programs (docs/agents.md, "Profiles").
AGENT_CONFIG_FOLDERS = (".claude", ".gemini", ".qwen", ".codex", ".opencode", ".factory", ".amp", ".copilot")
AGENT_CONFIG_FILES = (".mcp.json", "opencode.json", "opencode.jsonc")


@dataclass(frozen=True)
class ProtectedPaths:
    """Repository-relative (``/``-separated) folders and files of one workspace, and the ignore files whose rules
    can hide them."""

    folders: dict[str, str]  # folder -> reason
    files: dict[str, str]  # file -> reason
    ignore_files: tuple[str, ...]
    attribute_files: tuple[str, ...]  # the .gitattributes beside the ignore files
    names: tuple[str, ...]  # what an ignore rule naming one of them mentions

    @classmethod
    def of(cls, repo: Path, workspace: Path) -> ProtectedPaths:
        rel = PurePosixPath(workspace.resolve().relative_to(repo.resolve()).as_posix())
        fcop_folders = {"fcop", "docs/agents"}  # both candidates: a second one makes the workspace ambiguous
        fcop_files: set[str] = set()
        try:
            top = find_workspace_root(workspace).resolve() == workspace.resolve()
        except FcopError:
            top = False
        if top:  # FCoP folders directly in the workspace (a G2 layout): each folder an envelope may live in
            fcop_folders |= {LIFECYCLE_DIR, *G2_MARKERS, *ENVELOPE_FOLDERS}
            fcop_files = {FCOP_CONFIG}

        def at(name: str) -> str:
            return (rel / name).as_posix().removeprefix("./")

        chain = [PurePosixPath(*rel.parts[:i]) for i in range(len(rel.parts) + 1)]
        agents = [(d / name).as_posix().removeprefix("./") for d in chain for name in AGENT_CONFIG_FOLDERS]
        agent_files = [(d / name).as_posix().removeprefix("./") for d in chain for name in AGENT_CONFIG_FILES]
        folders = {at(STATE_DIR): PRIVATE_STATE, **{at(f): FCOP_FILES for f in sorted(fcop_folders)},
                   **dict.fromkeys(agents, AGENT_CONFIG)}
        files = {at(CONFIG_FILE): WORKSPACE_CONFIG, **{at(f): FCOP_FILES for f in fcop_files},
                 **dict.fromkeys(agent_files, AGENT_CONFIG)}
        ignore_files = tuple((d / IGNORE_FILE).as_posix().removeprefix("./") for d in chain)
        attribute_files = tuple((d / ATTRIBUTES_FILE).as_posix().removeprefix("./") for d in chain)
        names = (STATE_DIR, CONFIG_FILE, "fcop", "docs/agents", *(["_lifecycle"] if top else []))
        return cls(folders, files, ignore_files, attribute_files, names)

    def reason(self, path: str) -> str | None:
        """Why ``path`` (repository-relative) is the coordinator's, or None: inside a protected folder, or a file or
        link standing where one of them (or its parent) must be. Compared case-folded and NFC-normalised: on a
        file system that ignores case or normalises names (macOS), ``FCOP/…`` is written into ``fcop/``."""
        path = _folded(path)
        return next((why for name, why in self._folded if name == path or path.startswith(name + "/")
                     or name.startswith(path + "/")), None)

    @functools.cached_property
    def _folded(self) -> tuple[tuple[str, str], ...]:
        """Every protected file and folder, folded once (``reason`` runs for each path a change touches)."""
        return tuple((_folded(name), why) for name, why in {**self.files, **self.folders}.items())

    def excludes(self) -> list[str]:
        """Pathspecs that leave the protected paths out of a ``git add`` (literal: no name is a pattern)."""
        return [f":(top,exclude,literal){p}" for p in (*self.folders, *self.files)]

    def includes(self) -> list[str]:
        return [f":(top,literal){p}" for p in (*self.folders, *self.files)]

    def agent_config(self) -> list[str]:
        """Pathspecs of the agent CLIs' project configuration (reset before every run in a worktree)."""
        return [f":(top,literal){p}" for p, why in {**self.folders, **self.files}.items() if why == AGENT_CONFIG]

    def weakens_rules(self, patch_lines: Iterable[str]) -> bool:
        """Whether a ``.gitignore``'s unified diff removes a rule naming a protected path or adds a negation."""
        for line in patch_lines:
            if line.startswith(("+++", "---")):
                continue
            rule = line[1:].strip()
            if line.startswith("+") and rule.startswith("!"):
                return True
            if line.startswith("-") and self._names(rule):
                return True
        return False

    @staticmethod
    def rewrites_checkouts(patch_lines: Iterable[str]) -> bool:
        """Whether a ``.gitattributes``' unified diff adds an attribute that changes the bytes a checkout writes."""
        return any(line.startswith("+") and not line.startswith("+++") and not line[1:].lstrip().startswith("#")
                   and any(name in line for name in REWRITING) for line in patch_lines)

    def _names(self, rule: str) -> bool:
        """Whether an ignore rule names a protected path (``/.taskkernel/``, ``sub/.taskkernel/**``, …)."""
        core = rule.lstrip("!").removeprefix("/").removeprefix("**/")
        for suffix in ("/**", "/*", "/"):
            core = core.removesuffix(suffix)
        return any(core == name or core.endswith("/" + name) for name in self.names)


def _folded(path: str) -> str:
    return unicodedata.normalize("NFC", path).casefold()
