"""Entry point (`taskkernel`): `--version` is answered before any heavy import; everything else goes to the
typer app in coordinator/cli/root.py, whose command groups load when called."""

from __future__ import annotations

import sys


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("taskkernel")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args in (["--version"], ["-V"]):
        sys.stdout.write(f"taskkernel {version()}\n")
        sys.exit(0)
    from taskkernel.coordinator.cli.root import run

    run(args)
