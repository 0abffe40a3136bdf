"""Worktree benchmark: what one task's git worktree costs, and what a done report's diff adds to the report.

    python bench/worktrees.py            # a repository of 2 000 files, 20 tasks
    python bench/worktrees.py --quick    # 200 files, 5 tasks

Per task: the worktree created for its first run (`git worktree add`), found again for a later run, the done
report's diff recorded (commit what the agent left, diff against the base, write the patch), a fast-forward merge
into the base on approval. The diff is taken before the report's write transaction (only a check of the branch's
head runs inside it); the figure printed is the whole report with it against the same report on a task without a
worktree, measured in the same run: the ratio is (report with diff) / (report without). Target: the diff adds
less than a second to a report on this size of repository.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from taskkernel.coordinator import schema  # noqa: E402
from taskkernel.coordinator.compose import build_kernel  # noqa: E402
from taskkernel.coordinator.workspace import Workspace, init_workspace  # noqa: E402
from taskkernel.coordinator.worktrees.manager import Worktrees  # noqa: E402
from taskkernel.kernel.model.principal import LOCAL_OWNER, Principal  # noqa: E402
from taskkernel.kernel.store.db import Database  # noqa: E402

GIT_ID = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.invalid", "GIT_COMMITTER_NAME": "b",
          "GIT_COMMITTER_EMAIL": "b@example.invalid"}


def git(where: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(where), *args], check=True, capture_output=True, env={**os.environ, **GIT_ID})


def ms(samples: list[float]) -> str:
    return f"p50 {statistics.median(samples) * 1000:.1f} ms, max {max(samples) * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    files, tasks = (200, 5) if args.quick else (2000, 20)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        root.mkdir()
        git(root, "init", "-q", "-b", "main")
        for i in range(files):
            (root / "src" / f"m{i // 100}").mkdir(parents=True, exist_ok=True)
            (root / "src" / f"m{i // 100}" / f"f{i}.py").write_text(f"x = {i}\n" * 40)
        init_workspace(root)
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "start")
        ws = Workspace.load(root)
        db = Database(ws.database_url, "full")
        schema.ensure(db)  # as every command opens it: every component's tables, at head
        kernel = build_kernel(db, ws)
        trees = Worktrees(db, root)
        created, found, with_diff, without_diff, merged = [], [], [], [], []
        for n in range(tasks):
            ids = []
            for worktree in (True, False):
                made = kernel.submit({"type": "create_task", "idempotency_key": f"b{n}{worktree}", "payload": {
                    "sender": "ADMIN", "recipient": "DEV", "subject": f"bench {n}"}}, LOCAL_OWNER)
                assert made.task_id is not None
                task_id = made.task_id
                dev = Principal("DEV", "dev-agent")
                doc = kernel.task(task_id)
                assert doc is not None
                kernel.submit({"type": "claim", "task_id": task_id, "expected_revision": doc["revision"], "round": 0,
                               "idempotency_key": f"c{task_id}"}, dev)
                if worktree:
                    t0 = time.perf_counter()
                    wt = trees.ensure(task_id, None)
                    created.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    trees.ensure(task_id, None)
                    found.append(time.perf_counter() - t0)
                    (wt.path / "src" / "m0" / "f0.py").write_text(f"x = 'task {n}'\n")
                    (wt.path / f"new{n}.py").write_text("y = 1\n")
                doc = kernel.task(task_id)
                assert doc is not None
                t0 = time.perf_counter()
                done = kernel.submit({"type": "submit_report", "task_id": task_id, "expected_revision":
                                      doc["revision"], "round": 1, "idempotency_key": f"r{task_id}",
                                      "payload": {"status": "done", "body": "bench"}}, dev)
                (with_diff if worktree else without_diff).append(time.perf_counter() - t0)
                assert done.status == "accepted", done
                ids.append(task_id)
            report = kernel.task(ids[0])["reports"][0]  # type: ignore[index]
            assert report["diff"]["files_changed"] == 2, report
            t0 = time.perf_counter()
            result = trees.merge(ids[0], report["diff"]["head"], "bench")
            merged.append(time.perf_counter() - t0)
            assert result.ok, result
        print(f"repository: {files} files; {tasks} tasks")
        print(f"worktree created (first run): {ms(created)}")
        print(f"worktree found again (later run): {ms(found)}")
        print(f"done report with its diff: {ms(with_diff)}; without a worktree: {ms(without_diff)}")
        print(f"ratio (with diff / without): {statistics.median(with_diff) / statistics.median(without_diff):.1f}")
        print(f"merge into the base on approval: {ms(merged)}")
        print(f"target: the diff adds < 1 s to a report: {'met' if statistics.median(with_diff) < 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
