"""What a grant can mean: the grammar of ``allow``/``revoke`` payloads, checked where an input is accepted.

A grant is read by one of two consumers, and a grant neither can read is refused at the door (``invalid_grant``)
instead of being stored and never matching anything:

- **a task command** (docs/permissions.md): ``permission`` is a command type (``approve``, ``reopen``,
  ``force_archive``, …) and ``scope`` is exactly ``task:<TASK-ID>``, the one task it is for (matched exactly:
  no globs);
- **the execution gate** (docs/gate.md): ``permission`` is an operation (``write``, ``deploy``, ``*``, …) and
  ``scope`` an entity or glob (``file:config/*``, ``env:production``), never ``task:…``, which is the task
  commands' scope.

So a command type names a task grant, and a ``task:`` scope names a command: ``"permission": "aprove"`` with a
task scope, or ``"approve"`` with a scope that is not ``task:<TASK-ID>``, is refused with the near miss.
Imported history (interchange files) is the record of the past and is not judged by this grammar.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from taskkernel.kernel.model.commands import CommandType
from taskkernel.kernel.model.ids import TASK_ID_RE, task_id_problem
from taskkernel.kernel.sessionlog.models import InputKind, SessionLogError, SessionReason

TASK_SCOPE = "task:"
COMMANDS = tuple(c.value for c in CommandType)
GRANT_KINDS = frozenset({InputKind.ALLOW, InputKind.REVOKE})
MAX_OPERATION = 100  # a `perform` operation's length (kernel/model/commands.py)
MAX_ENTITY = 500  # a `perform` entity's length


def _near(word: str, candidates: tuple[str, ...]) -> str | None:
    found = difflib.get_close_matches(word.lower(), candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def _printable(text: str) -> bool:
    return text.isprintable() and text == text.strip()


def grant_problem(permission: str, scope: str) -> str | None:
    """Why ``(permission, scope)`` is a grant nothing can read, or None."""
    prefix, colon, rest = scope.partition(":")
    bare_task = TASK_ID_RE.match(scope) is not None
    task_like = colon and prefix != "task" and (
        difflib.SequenceMatcher(None, prefix.lower(), "task").ratio() >= 0.75 or TASK_ID_RE.match(rest.strip()))
    if task_like or bare_task:
        fixed = f"task:{rest.strip() if colon else scope}"
        return f"scope {scope!r} is not a scope the kernel reads; did you mean {fixed!r}?"
    if scope.startswith(TASK_SCOPE):
        if problem := task_id_problem(rest):
            return f"scope {scope!r}: a task grant names one task, task:<TASK-ID> ({problem}; no globs)"
        if permission not in COMMANDS:
            guess = _near(permission, COMMANDS)
            return (f"permission {permission!r} is not a task command" + (f"; did you mean {guess!r}?" if guess else "")
                    + " (a task:… scope is granted a command: approve, reopen, force_archive, …)")
        return None
    if permission in COMMANDS:
        return (f"permission {permission!r} is a task command: its scope is the task, task:<TASK-ID>, not "
                f"{scope!r}")
    if not _printable(permission) or " " in permission or len(permission) > MAX_OPERATION:
        return (f"permission {permission!r} is not an operation name (no spaces or control characters, at most "
                f"{MAX_OPERATION} characters; \"*\" for every operation)")
    if not _printable(scope) or len(scope) > MAX_ENTITY:
        return (f"scope {scope!r} is not an entity (no control characters or surrounding spaces, at most "
                f"{MAX_ENTITY} characters)")
    return None


def check_grant(kind: InputKind | str, payload: Mapping[str, Any]) -> None:
    """Raise ``invalid_grant`` for an allow/revoke whose permission and scope nothing reads (payload shape is
    ``validate_payload``'s: this runs after it)."""
    if InputKind(kind) not in GRANT_KINDS:
        return
    permission, scope = payload.get("permission"), payload.get("scope")
    if not (isinstance(permission, str) and isinstance(scope, str)):
        return  # validate_payload refuses it
    if problem := grant_problem(permission, scope):
        raise SessionLogError(SessionReason.INVALID_GRANT, f"{InputKind(kind).value}: {problem}")
