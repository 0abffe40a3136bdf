"""Entry point (`taskkernel`): `--version` is answered before any heavy import; everything else goes to the
typer app in coordinator/cli/root.py, whose command groups load when called."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args in (["--version"], ["-V"]):
        from taskkernel import __version__

        sys.stdout.write(f"taskkernel {__version__}\n")
        sys.exit(0)
    from taskkernel.coordinator.cli.root import run

    run(args)
