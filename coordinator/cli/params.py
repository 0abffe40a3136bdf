"""Cheap coercion of the CLI's plain parameters (issue 29, goal 4a).

typer 0.29 converts every parameter value, even an absent one, through a pydantic ``TypeAdapter`` it builds on
first use (``typer.core._TyperParameter.get_runtime_param``): building the first one loads pydantic's validation
machinery, about 300 M instructions, a fifth of `task show`. Our parameters are nearly all plain ``str``,
``int``, ``float``, ``bool`` and ``Path`` values (``X | None`` reaches typer as ``X``), whose conversion needs none of
that. ``install`` gives each such parameter of the command a call runs a runtime parameter of ours, through
typer's own lazy slot ``_runtime_param`` (a private hook: pyproject.toml pins typer's minor version and
tests/test_cli_params.py fails if the hook stops being used). It converts only the values whose typer result is
certain (a ``str``; a short decimal ``int`` or ``float`` within its bounds; a ``bool``; a ``Path`` through
typer's own path checks) and hands every other value to typer's own coercion, built then: a value typer refuses
is refused with typer's own message (exit 64 through root.py), a value it converts converts alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer.core
from typer import BadParameter
from typer._click import Command, Context
from typer._coercion import RuntimeParam, build_runtime_param
from typer._param_types import coerce_cli_path

# What Python and pydantic read alike: no blanks, underscores, exponents, inf or nan; short enough for any limit
DECIMAL = re.compile(r"[+-]?[0-9]{1,18}")
FRACTION = re.compile(r"[+-]?[0-9]{1,15}(?:\.[0-9]{1,15})?")


class _Plain(RuntimeParam):
    """A parameter's coercion for the values it is sure of; any other value goes to typer's own."""

    def _coerce_value(self, value: Any, param: typer.core._TyperParameter, ctx: Context) -> Any:
        converted = self.convert(value, param, ctx)
        if converted is _UNSURE:
            own = param._runtime_param = build_runtime_param(param.type_descriptor)  # from now on typer's own
            return own._coerce_value(value, param=param, ctx=ctx)
        return converted

    def convert(self, value: Any, param: typer.core._TyperParameter, ctx: Context) -> Any:
        raise NotImplementedError  # pragma: no cover - every kind below has its own


_UNSURE = object()  # a value only typer's own coercion may convert (or refuse, with its message)


class _Str(_Plain):
    def convert(self, value: Any, param: typer.core._TyperParameter, ctx: Context) -> Any:
        return value if type(value) is str else _UNSURE  # typer: str(value), then pydantic's str: the same str


class _Bool(_Plain):
    def convert(self, value: Any, param: typer.core._TyperParameter, ctx: Context) -> Any:
        return value if type(value) is bool else _UNSURE


class _Number(_Plain):
    kind: type[int | float]
    text: re.Pattern[str]

    def convert(self, value: Any, param: typer.core._TyperParameter, ctx: Context) -> Any:
        if type(value) is self.kind:
            number = value
        elif type(value) is str and self.text.fullmatch(value):
            number = self.kind(value)
        else:
            return _UNSURE
        low, high = self.parameter_info.min, self.parameter_info.max
        if number != number:  # a NaN (a coded default): no bound refuses it, typer's check does
            return _UNSURE
        if (low is not None and number < low) or (high is not None and number > high):
            return _UNSURE  # out of bounds: typer's message says which
        return number


class _Int(_Number):
    kind, text = int, DECIMAL


class _Float(_Number):
    kind, text = float, FRACTION


class _Path(_Plain):
    def convert(self, value: Any, param: typer.core._TyperParameter, ctx: Context) -> Any:
        if type(value) is str and "\0" not in value:
            value = Path(value)  # what pydantic's Path makes of a str (typer's step before its checks)
        elif not isinstance(value, Path):
            return _UNSURE
        try:  # typer's own checks (exists, file_okay, resolve_path, ...)
            return coerce_cli_path(value, self.parameter_info, path_type=Path, param=param, ctx=ctx)
        except (ValueError, BadParameter):  # refused: typer says so itself, quoting the path as it was typed (the
            return _UNSURE  # Path made above tidied "./x" and "x/"), and through pydantic where it does


KINDS: dict[Any, type[_Plain]] = {str: _Str, bool: _Bool, int: _Int, float: _Float, Path: _Path}


def plain(param: Any) -> _Plain | None:
    """Our coercion for ``param`` if it is one value of a plain kind with nothing custom; else None (typer's)."""
    descriptor = getattr(param, "type_descriptor", None)
    if not isinstance(param, typer.core._TyperParameter) or descriptor is None:
        return None
    info, annotation = descriptor.parameter_info, descriptor.annotation
    kind = KINDS.get(annotation) if isinstance(annotation, type) else None
    if (kind is None or param.multiple or param.nargs != 1 or getattr(param, "count", False)
            or descriptor.file_annotation is not None or info.parser is not None
            or (issubclass(kind, _Number) and info.clamp) or (kind is _Path and info.path_type is not None)):
        return None
    return kind(parameter_info=info, annotation=annotation)


def install(command: Command) -> None:
    """Give the plain parameters of ``command`` and its subcommands (help options included) our coercion."""
    for param in command.params:
        _use_plain(param)
    _plain_help(command)
    for sub in getattr(command, "commands", {}).values():
        install(sub)


def _use_plain(param: Any) -> None:
    if getattr(param, "_runtime_param", False) is None:  # typer's slot, still empty
        fast = plain(param)
        if fast is not None:
            param._runtime_param = fast


def _plain_help(command: Command) -> None:
    """click makes a command's --help option when it first parses (from the context's option names): that one
    gets ours too."""
    make: Callable[[Context], Any] = command.get_help_option

    def get_help_option(ctx: Context) -> Any:
        option = make(ctx)
        if option is not None:
            _use_plain(option)
        return option

    command.get_help_option = get_help_option  # type: ignore[method-assign]
