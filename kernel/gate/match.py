"""Small, exact comparisons the rules share: JSON value equality, entity and scope matching."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any


def same_value(a: Any, b: Any) -> bool:
    """JSON equality: ``false`` is not ``0`` and ``"1"`` is not ``1`` (Python's ``==`` would say otherwise)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def names(value: str | list[str] | None) -> tuple[str, ...]:
    """An entity/operation field as a tuple (a string is a one-element list)."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)



def entity_is(event_entity: str | list[str] | None, entity: str) -> bool:
    """Exact entity identity (bases, evidence): the event is about ``entity`` if it names it."""
    return entity in names(event_entity)


def entity_covered(patterns: str | list[str] | None, entity: str) -> bool:
    """Grant/revoke/policy scope: ``*`` globs allowed (``fnmatch`` rules, case-sensitive; ``*`` also spans ``/``)."""
    return any(fnmatchcase(entity, p) for p in names(patterns))


def op_covered(operations: str | list[str] | None, operation: str) -> bool:
    ops = names(operations)
    return "*" in ops or operation in ops


def triple_key(principal: str | None, entity: str | list[str], operation: str | list[str]) -> tuple[Any, ...]:
    """Identity of a grant's scope: a later trusted grant/revoke with the same key supersedes it."""
    return (principal, tuple(sorted(set(names(entity)))), tuple(sorted(set(names(operation)))))
