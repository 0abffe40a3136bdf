"""The CLI's own coercion of plain parameters (coordinator/cli/params.py, issue 29 goal 4a): the values it
converts come out as typer's own coercion makes them, every other value goes to typer's (its message, exit 64),
and a real `task show` builds no pydantic adapter (the test that fails if typer's private hook stops working)."""

from __future__ import annotations

import ast
import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.core
import typer.main

from taskkernel.coordinator.cli import params
from tests.cli_support import cli_env, new_workspace, run

sample = typer.Typer()


@sample.command()
def every_kind(  # one option per kind and variant the CLI uses
        s: str = typer.Option(None), a: str = typer.Argument(None), i: int = typer.Option(None),
        i_range: int = typer.Option(None, min=0, max=100), i_min: int = typer.Option(3, min=1),
        f: float = typer.Option(None), f_range: float = typer.Option(None, min=0, max=1.5),
        b: bool = typer.Option(False, "--b"), p: Path = typer.Option(None),
        p_exists: Path = typer.Option(None, exists=True), p_file: Path = typer.Option(None, dir_okay=False),
        p_dir: Path = typer.Option(None, file_okay=False), p_resolved: Path = typer.Option(None, resolve_path=True),
        p_dash: Path = typer.Option(None, allow_dash=True, dir_okay=False)) -> None:
    """Not run: its parameters are converted one by one."""


SURE: dict[str, list[Any]] = {  # values params.py converts itself (a path through typer's checks, which may refuse)
    "s": ["abc", "", "\udcff", "a\0b", " 12 ", "-"], "a": ["TASK-20261202-001", ""],
    "i": ["12", "+12", "-12", "012", "-0", "0", "9" * 18, 7], "i_range": ["0", "100", "55"], "i_min": ["1", 3],
    "f": ["1.5", "-2", "0.25", "+3.0", "7", 2.5], "f_range": ["0", "1.5", "0.75"], "b": [True, False],
    "p": ["", ".", "f.txt", "d", "nope", "\udcff", "-", Path("d")], "p_exists": ["f.txt", "d", "./d/"],
    "p_file": ["f.txt", "nope", "./f.txt"], "p_dir": ["d", "nope", "d/"], "p_resolved": ["d/../f.txt", "nope"],
    "p_dash": ["-", "f.txt"],
}
UNSURE: dict[str, list[Any]] = {  # values typer's own coercion converts or refuses
    "s": [b"abc", b"\xff", 5], "a": [b"x"],
    "i": [" 12", "12 ", "1_000", "1.0", "1.5", "1e3", "", "\u0663", "0x10", "9" * 19, "9" * 5000, "\udcff", "x",
          b"12", "-", "+", 2.0, True],
    "i_range": ["-1", "101", "x", "+101"], "i_min": ["0", 0],
    "f": ["inf", "nan", "1e3", ".5", "1.", " 1.5", "1_0.5", "x", "", 2, b"1.5"], "f_range": ["-0.5", "1.6", "2"],
    "b": ["true", "no", "", "x", 1, 0, "  yes "],
    "p": ["a\0b", b"f.txt", 5], "p_resolved": ["a\0b"],
    # refused by typer's path checks: its message quotes the path as typed, which a Path would have tidied
    "p_exists": ["a\0b", "nope", "./nope", "nope/", "a//nope"], "p_file": ["d", "./d", "d/", ""],
    "p_dir": ["f.txt", "./f.txt"],
}


def outcome(param: Any, value: Any) -> tuple[Any, ...]:
    """What converting ``value`` gives: the value and its type, or the refusal's type and message."""
    ctx = typer.Context(typer.main.get_command(sample))
    try:
        got = param.process_value(ctx, value)
    except Exception as exc:  # noqa: BLE001 - the refusal is the outcome compared
        message = exc.format_message() if isinstance(exc, typer.BadParameter) else str(exc)
        return "refused", type(exc), message
    return "converted", type(got), repr(got)  # repr: nan equals nan


def fresh(name: str, *, ours: bool) -> Any:
    """The parameter ``name`` of a newly built command, with our coercion installed or typer's alone."""
    command = typer.main.get_command(sample)
    if ours:
        params.install(command)
    return next(p for p in command.params if p.name == name)


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "d").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, vs in SURE.items() for v in vs], ids=repr)
def test_a_value_it_is_sure_of_converts_as_typer_converts_it(files: Path, name: str, value: Any) -> None:
    param = fresh(name, ours=True)
    assert isinstance(param._runtime_param, params._Plain)
    assert outcome(param, value) == outcome(fresh(name, ours=False), value)
    assert isinstance(param._runtime_param, params._Plain), "converted without typer's adapter"


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, vs in UNSURE.items() for v in vs], ids=repr)
def test_any_other_value_gets_typers_own_answer(files: Path, name: str, value: Any) -> None:
    param = fresh(name, ours=True)
    assert outcome(param, value) == outcome(fresh(name, ours=False), value)
    assert not isinstance(param._runtime_param, params._Plain), "handed to typer's coercion"


class Colour(Enum):
    RED = "red"


def test_only_plain_single_values_get_ours() -> None:
    other = typer.Typer(add_completion=False)

    @other.command()
    def kinds(tags: list[str] = typer.Option(None), colour: Colour = typer.Option(None),
              clamped: int = typer.Option(None, min=0, max=3, clamp=True),
              parsed: str = typer.Option(None, parser=str.upper), plain: str = typer.Option(None)) -> None:
        """Not run."""

    command = typer.main.get_command(other)
    params.install(command)
    assert {p.name: isinstance(p._runtime_param, params._Plain) for p in command.params} == {  # type: ignore[attr-defined]
        "tags": False, "colour": False, "clamped": False, "parsed": False, "plain": True}
    help_option = command.get_help_option(typer.Context(command))
    assert help_option is not None and isinstance(help_option._runtime_param, params._Plain)  # type: ignore[attr-defined]


# Which parameter annotations typer built its own (pydantic) coercion for, and whether its adapters module loaded
PROBE = ("import atexit, sys, typer.core\n"
         "built, own = [], typer.core.build_runtime_param\n"
         "typer.core.build_runtime_param = lambda d: built.append(repr(d.annotation)) or own(d)\n"
         "atexit.register(lambda: print(repr((built, 'typer._adapters' in sys.modules)), file=sys.stderr))\n"
         "from taskkernel.coordinator.cli.app import main\n"
         "main(sys.argv[1:])\n")


def coercions_built(*args: str, cwd: Path) -> tuple[list[str], bool]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True,
                          env=cli_env(), timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    result: tuple[list[str], bool] = ast.literal_eval(done.stderr.strip().splitlines()[-1])
    return result


def test_task_show_builds_no_typer_adapter(tmp_path: Path) -> None:
    """If typer stops reading its `_runtime_param` slot (or renames it), every parameter of `task show` gets a
    pydantic adapter again (~300 M instructions): this fails."""
    ws = new_workspace(tmp_path)
    made = run("task", "create", "--to", "PM", "--subject", "shown", cwd=ws)
    assert made.code == 0, made.err
    assert coercions_built("task", "show", made.json["task_id"], cwd=ws) == ([], False)
    assert coercions_built("--token-file", str(tmp_path / "none"), "task", "show", "x", cwd=ws) == ([], False)
    assert coercions_built("log", "--from", "1", "--json", cwd=ws) == ([], False)


def test_a_refused_value_is_typers_usage_error(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path)
    for args, message in ((("task", "list", "--limit", "x"), "Invalid value for '--limit': Input should be a valid "
                           "integer, unable to parse string as an integer"),
                          (("log", "--from", "0"), "Invalid value for '--from': Input should be greater than or "
                           "equal to 1")):
        r = run(*args, cwd=ws)
        assert r.code == 64 and r.err.strip() == f"usage error: {message}", (args, r.code, r.err)
        assert "Traceback" not in r.err
    assert run("log", "--from", "1", "--json", cwd=ws).code == 0
