"""`python -m taskkernel`: the same entry point as the `taskkernel` console script."""

from taskkernel.coordinator.cli.app import main

main()
