"""A real kernel process for crash and concurrency tests.

    python -m tests.procs.kernel_worker DB_URL serve      # JSON lines in: {"command": ..., "role": ...}
    python -m tests.procs.kernel_worker DB_URL once START_AT ROLE COMMAND_JSON

Each result line is printed only after the kernel returned, i.e. after commit.
"""

from __future__ import annotations

import json
import sys
import time

from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.principal import Principal
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.schema import metadata
from taskkernel.roles.registry import RoleRegistry


def make_kernel(url: str) -> TaskCommandKernel:
    db = Database(url)
    db.create_schema(metadata)
    return TaskCommandKernel(db, RoleRegistry.for_team("PM", ["PM", "DEV", "QA", "OPS"], load_plugins=False))


def principal(role: str) -> Principal:
    return Principal(role, f"{role.lower()}-worker")


def main() -> None:
    url, mode = sys.argv[1], sys.argv[2]
    kernel = make_kernel(url)
    if mode == "once":
        start_at, role, command = float(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
        time.sleep(max(0.0, start_at - time.time()))
        print(json.dumps(kernel.submit(command, principal(role)).wire()), flush=True)
        return
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        result = kernel.submit(msg["command"], principal(msg["role"]))
        print(json.dumps(result.wire()), flush=True)


if __name__ == "__main__":
    main()
