"""The package as a user installs it: a wheel built from this tree, installed into a clean virtualenv,
holds one top-level package (`taskkernel`), installs without warnings and runs the demo end to end."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_alone_and_runs_the_demo(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip"]
    built = subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("taskkernel-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)],
                               capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    assert "deprecat" not in (installed.stdout + installed.stderr).lower()

    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = {p.name for p in site.iterdir() if p.name.startswith("taskkernel")}
    assert {"taskkernel"} <= ours
    assert not {"kernel", "roles", "scheduler", "coordinator"} & {p.name for p in site.iterdir()}

    # Outside the repository, so nothing can be imported from this tree by accident.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    version = subprocess.run([str(env_dir / "bin" / "taskkernel"), "--version"], cwd=outside,
                             capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("taskkernel ")
    demo = subprocess.run([str(env_dir / "bin" / "taskkernel"), "demo", "--dir", str(outside / "demo")],
                          cwd=outside, capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "verify: ok" in demo.stdout + demo.stderr
    assert "Traceback" not in demo.stderr
