"""Pluggable reducers: fold the replayed context of one session into a state.

A reducer gets the *effective* context (rollbacks applied, acceptance order) and the full
replayed list (for reporting what a rollback dropped). ``fold`` runs on the hot path over plain
``Rec`` tuples; ``to_json`` shapes the state for the CLI only when it is printed.
Register more with ``register_reducer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from taskkernel.kernel.sessionlog.models import InputKind, Rec, SessionLogError, SessionReason

_ALLOW = InputKind.ALLOW.value
_REVOKE = InputKind.REVOKE.value
_ROLLBACK = InputKind.ROLLBACK.value


class Reducer(Protocol):
    name: str

    def fold(self, effective: Sequence[Rec], replayed: Sequence[Rec]) -> Any: ...

    def to_json(self, state: Any) -> Any: ...


class InputsReducer:
    """The ordered context itself: what the session was told, in acceptance order."""

    name = "inputs"

    def fold(self, effective: Sequence[Rec], replayed: Sequence[Rec]) -> Any:
        return (effective, replayed)

    def to_json(self, state: Any) -> dict[str, Any]:
        effective, replayed = state
        kept = {r[1] for r in effective}
        return {
            "count": len(effective),
            "inputs": [{"seq": r[0], "input_id": r[1], "kind": r[2], "payload": r[3]} for r in effective],
            "rolled_back": [r[1] for r in replayed if r[1] not in kept and r[2] != _ROLLBACK],
        }


class PermissionReducer:
    """Folds allow/revoke per (permission, scope); every pair starts at deny.

    State: ``{(permission, scope): (decision, seq, input_id)}``. Scopes match exactly: a revoke
    in one scope does not touch a grant in another.
    """

    name = "permission"

    def fold(self, effective: Sequence[Rec], replayed: Sequence[Rec]) -> dict[tuple[str, str], tuple[str, Any, str]]:
        state: dict[tuple[str, str], tuple[str, Any, str]] = {}
        for r in effective:
            kind = r[2]
            if kind in (_ALLOW, _REVOKE):
                p = r[3]
                state[(p["permission"], p["scope"])] = ("allow" if kind == _ALLOW else "deny", r[0], r[1])
        return state

    def to_json(self, state: dict[tuple[str, str], tuple[str, Any, str]]) -> dict[str, Any]:
        """``decision`` is the single pair's decision, "deny" for an empty log, null for several pairs."""
        perms: dict[str, dict[str, dict[str, Any]]] = {}
        for (perm, scope), (verdict, seq, input_id) in sorted(state.items()):
            perms.setdefault(perm, {})[scope] = {"decision": verdict, "seq": seq, "input_id": input_id}
        decision: str | None = None
        if not state:
            decision = "deny"
        elif len(state) == 1:
            decision = next(iter(state.values()))[0]
        return {"decision": decision, "permissions": perms}

    @staticmethod
    def lookup(
        state: dict[tuple[str, str], tuple[str, Any, str]], permission: str, scope: str
    ) -> tuple[Literal["allow", "deny"], Any, Any]:
        verdict, seq, input_id = state.get((permission, scope), ("deny", None, None))
        return ("allow" if verdict == "allow" else "deny"), seq, input_id


_REDUCERS: dict[str, Reducer] = {}


def register_reducer(reducer: Reducer) -> None:
    _REDUCERS[reducer.name] = reducer


def get_reducer(name: str) -> Reducer:
    try:
        return _REDUCERS[name]
    except KeyError:
        raise SessionLogError(
            SessionReason.INVALID_INPUT, f"unknown reducer {name!r} (known: {', '.join(sorted(_REDUCERS))})"
        ) from None


def reducer_names() -> list[str]:
    return sorted(_REDUCERS)


register_reducer(InputsReducer())
register_reducer(PermissionReducer())
