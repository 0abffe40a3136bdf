"""The layers docs/architecture.md describes hold in the code: the coordinator and its adapters import the
scheduler, the roles and the kernel core; the core imports none of them (import-linter, pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_imports_point_inward() -> None:
    linter = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(linter), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout
