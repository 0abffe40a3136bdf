"""`verify` proves the store (issue 9, items 7 and 8): a keyed hash chain an attacker without the key cannot
recompute, a sealed chain head so that deleting the newest events is noticed too, receipts and stored tasks that
remember more than the log holds, `--repair` that refuses to launder any of it, damaged SQLite files reported as
JSON, TASK files of tasks the log lost, private file modes, and schema creation by processes starting together.

Every verdict comes from the real CLI in a separate process; setup and tampering run in this process, the way
an attacker holding the database (but not the workspace's chain key) would."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from taskkernel.coordinator.cli.common import CliContext
from taskkernel.coordinator.workspace import init_workspace
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.model.principal import LOCAL_OWNER
from taskkernel.kernel.store.chain import ChainKey, ChainKeyError, legacy_head_seal, legacy_link
from taskkernel.kernel.store.db import Database
from taskkernel.kernel.store.events import EventStore, NewEvent, verify_chain
from taskkernel.kernel.store.schema import metadata
from tests.cli_support import CLI, Run, cli_env, run
from tests.coord_support import make_workspace

Link = Callable[..., str]


def workspace_kernel(root: Path) -> TaskCommandKernel:
    """The kernel exactly as the CLI composes it (workspace chain key included)."""
    return CliContext(workspace_path=str(root)).kernel()


def create(kernel: TaskCommandKernel, subject: str) -> str:
    r = kernel.submit({"type": "create_task", "idempotency_key": f"k-{subject}", "payload": {
        "sender": "ADMIN", "recipient": "PM", "subject": subject, "body": "x" * 200}}, LOCAL_OWNER)
    assert r.status == "accepted", r
    assert r.task_id is not None
    return r.task_id


def workspace_with_tasks(root: Path, n: int = 3, database: str | None = None) -> list[str]:
    make_workspace(root, {}, database=database)
    kernel = workspace_kernel(root)
    ids = [create(kernel, f"task {i}") for i in range(n)]
    kernel.db.dispose()
    return ids


def rows(url: str) -> list[tuple]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        out = [tuple(r) for r in conn.exec_driver_sql(
            "SELECT global_pos, stream_id, stream_version, event_type, schema_version, data, meta, recorded_at, hash"
            " FROM events ORDER BY global_pos")]
    engine.dispose()
    return out


def rewrite(url: str, original: list[tuple], pos: int, link: Link, *, sql: str = "") -> None:
    """The attacker: change the data of event ``pos`` and recompute every later link with ``link``."""
    engine = sa.create_engine(url)
    prev = original[pos - 2][8] if pos > 1 else "0" * 64
    with engine.begin() as conn:
        for r in original[pos - 1:]:
            data = r[5].replace('"task ', '"forged ') if r[0] == pos else r[5]
            prev = link(prev, r[0], r[1], r[2], r[3], r[4], data, r[6], r[7])
            conn.execute(sa.text("UPDATE events SET data = :d, hash = :h WHERE global_pos = :p"),
                         {"d": data, "h": prev, "p": r[0]})
        if sql:
            conn.exec_driver_sql(sql)
    engine.dispose()


def restore(url: str, original: list[tuple]) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for r in original:
            conn.execute(sa.text("UPDATE events SET data = :d, hash = :h WHERE global_pos = :p"),
                         {"d": r[5], "h": r[8], "p": r[0]})
    engine.dispose()


def sqlite_url(root: Path) -> str:
    return f"sqlite:///{root / '.taskkernel' / 'kernel.db'}"


def assert_clean(r: Run) -> None:
    assert "Traceback" not in r.err, r.err


# -- the keyed chain --------------------------------------------------------------------------------------------
ATTACKERS: dict[str, Link] = {
    "legacy sha256 link": legacy_link,
    "plain sha256": lambda prev, *fields: hashlib.sha256((prev + "".join(map(str, fields))).encode()).hexdigest(),
    "hmac with a guessed key": ChainKey(os.urandom(32)).link,
}


def test_recomputed_chain_is_broken_at_the_rewritten_position_and_repair_refuses(tmp_path: Path,
                                                                                  any_url: str) -> None:
    root = tmp_path / "ws"
    ids = workspace_with_tasks(root, 4, database=None if any_url.startswith("sqlite") else any_url)
    url = sqlite_url(root) if any_url.startswith("sqlite") else any_url
    original = rows(url)
    assert run("verify", cwd=root).json["chain"] == "hmac-sha256"
    for name, link in ATTACKERS.items():
        rewrite(url, original, 2, link)
        r = run("verify", cwd=root)
        assert (r.code, r.json["reason"], r.json["first_broken_position"]) == (2, "hash_chain", 2), (name, r.out)
        assert r.json["problems"][0]["kind"] == "hash_chain"
        restore(url, original)
    # --repair would copy the forged data into the read model: it refuses while the chain is broken
    rewrite(url, original, 2, legacy_link)
    r = run("verify", "--repair", cwd=root)
    assert (r.code, r.json["reason"], r.json["repaired"]) == (2, "hash_chain", 0)
    assert "refusing to repair" in r.err
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        doc = conn.execute(sa.text("SELECT doc FROM tasks WHERE task_id = :t"), {"t": ids[1]}).scalar()
    engine.dispose()
    assert '"task 1"' in doc and "forged" not in doc


def test_missing_key_and_removed_chain_record_are_never_proven(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    workspace_with_tasks(root, 2)
    key, aside = root / ".taskkernel" / "chain.key", tmp_path / "chain.key.bak"
    shutil.move(key, aside)
    r = run("verify", cwd=root)
    assert (r.code, r.json["reason"]) == (2, "chain_key_missing"), r.out
    submit = run("submit", cwd=root, stdin='{"type":"create_task","idempotency_key":"k9","payload":'
                                          '{"sender":"ADMIN","recipient":"PM","subject":"no key"}}')
    assert submit.code != 0 and "chain_key_missing" in submit.err
    assert not key.exists()  # a missing key is never silently replaced by a new one
    shutil.move(aside, key)
    url = sqlite_url(root)
    assert len(rows(url)) == 2
    # the attacker removes the chain record and recomputes everything with the legacy link
    rewrite(url, rows(url), 1, legacy_link, sql="DELETE FROM store_meta")
    r = run("verify", cwd=root)
    assert (r.code, r.json["reason"], r.json["first_broken_position"]) == (2, "chain_unkeyed", 1), r.out


def test_keyless_database_stops_appending_once_the_store_is_keyed(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    make_workspace(root, {})
    url = sqlite_url(root)
    legacy = Database(url)
    legacy.create_schema(metadata)
    store = EventStore()
    for i in range(3):
        with legacy.write() as uow:
            store.append(uow, "s", i, [NewEvent("e", {"task": f"task {i}"})], {})
    assert not (root / ".taskkernel" / "chain.key").exists()
    r = run("verify", cwd=root)  # the new version adopts the legacy chain and keys it from position 4
    assert (r.code, r.json["chain"]) == (0, "hmac-sha256"), r.out
    assert stat.S_IMODE((root / ".taskkernel" / "chain.key").stat().st_mode) == 0o600
    with pytest.raises(ChainKeyError, match="chain_key_missing"), legacy.write() as uow:
        store.append(uow, "s", 3, [NewEvent("e", {})], {})
    keyed = workspace_kernel(root).db
    with keyed.write() as uow:
        store.append(uow, "s", 3, [NewEvent("e", {"task": "task 3"})], {})
    keyed.dispose()
    legacy.dispose()
    # rewriting a legacy event and recomputing the legacy links still breaks the first keyed link
    rewrite(url, rows(url), 2, legacy_link)
    r = run("verify", cwd=root)
    assert (r.code, r.json["reason"], r.json["first_broken_position"]) == (2, "hash_chain", 4), r.out


def test_an_edited_chain_record_or_another_key_is_never_proven(sqlite_url: str) -> None:
    """In process, on the store API: the seal pins the first keyed position; a different key proves nothing."""
    key = os.urandom(32)
    db = Database(sqlite_url, chain_key=key)
    db.create_schema(metadata)
    store = EventStore()
    for i in range(4):
        with db.write() as uow:
            store.append(uow, "s", i, [NewEvent("e", {"i": i})], {})
    with db.read() as conn:
        assert verify_chain(store, conn, db.chain) is None
        assert verify_chain(store, conn, Database("sqlite://", chain_key=os.urandom(32)).chain).reason \
            == "chain_key_mismatch"
    with db.write() as uow:  # claim the chain is keyed only from position 9, then recompute with legacy links
        uow.conn.exec_driver_sql("UPDATE store_meta SET value = replace(value, '\"keyed_from\": 1', "
                                 "'\"keyed_from\": 9')")
    rewrite(sqlite_url, rows(sqlite_url), 3, legacy_link)
    with db.read() as conn:
        brk = verify_chain(store, conn, db.chain)
    assert brk is not None and (brk.global_pos, brk.reason) == (3, "hash_chain")
    db.dispose()


# -- damaged databases ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["page", "not a database"])
def test_damaged_sqlite_file_is_database_corrupt_as_json(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "ws"
    workspace_with_tasks(root, 20)
    db_file = root / ".taskkernel" / "kernel.db"
    assert not Path(f"{db_file}-wal").exists()
    size = db_file.stat().st_size
    with open(db_file, "r+b") as fh:
        if damage == "page":
            fh.seek((size // 2) // 4096 * 4096)
            fh.write(b"\xff" * 4096)
        else:
            fh.write(b"this is not a database " * (size // 23))
    r = run("verify", cwd=root)
    assert_clean(r)
    assert (r.code, r.json["reason"]) == (2, "database_corrupt"), (r.out, r.err)


# -- TASK files of tasks the log does not know ------------------------------------------------------------------
def planted(root: Path, task_id: str, stage: str) -> Path:
    path = root / "fcop" / "_lifecycle" / stage / f"{task_id}-ADMIN-to-PM.md"
    path.write_text("---\nprotocol: fcop\nversion: 1\nsender: ADMIN\nrecipient: PM\npriority: P2\n"
                    "subject: planted\n---\nbody\n", encoding="utf-8")
    return path


def test_task_files_of_tasks_the_log_lost_are_reported_but_ingest_lag_is_not(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    make_workspace(root, {})
    url = sqlite_url(root)
    kernel = workspace_kernel(root)
    first = create(kernel, "task 0")
    saved_head = head_row(url)  # the attacker keeps a copy of the head while the log ends at the first task
    lost = create(kernel, "task 1")
    kernel.db.dispose()
    assert run("up", "--once", cwd=root).code == 0  # projects both TASK files; the adapter records them
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # the log loses its tail: the chain of what is left stays intact
        lost_from = conn.execute(sa.text("SELECT min(global_pos) FROM events WHERE stream_id = :s"),
                            {"s": f"task:{lost}"}).scalar()
        assert conn.execute(sa.text("SELECT count(*) FROM events WHERE global_pos > :p AND stream_id != :s"),
                            {"p": lost_from, "s": f"task:{lost}"}).scalar() == 0
        for sql in ("DELETE FROM events WHERE stream_id = :s", "DELETE FROM tasks WHERE task_id = :t",
                    "DELETE FROM receipts WHERE task_id = :t", "DELETE FROM outbox WHERE payload LIKE :like"):
            conn.execute(sa.text(sql), {"s": f"task:{lost}", "t": lost, "like": f"%{lost}%"})
        # a file planted together with a forged adapter record, so that ingest would never look at it
        hidden = planted(root, "TASK-20200101-007", "done")
        conn.execute(sa.text("INSERT INTO folder_files (rel, sha256, task_id, origin, updated_at) VALUES "
                             "(:rel, :sha, :t, 'ingested', '2020-01-01T00:00:00Z')"),
                     {"rel": f"_lifecycle/done/{hidden.name}",
                      "sha": hashlib.sha256(hidden.read_bytes()).hexdigest(), "t": "TASK-20200101-007"})
    engine.dispose()
    planted(root, "TASK-20200101-008", "review")  # not taken yet: the next ingest pass adopts it (lag)
    r = run("verify", cwd=root)  # the sealed head says where the log ended
    assert (r.code, r.json["reason"], r.json["first_broken_position"]) == (2, "hash_chain", lost_from), r.out
    # rolled back to the head the attacker kept: the database alone cannot tell (docs/durability.md), the TASK
    # files of the lost task can
    set_head(url, saved_head)
    r = run("verify", cwd=root)
    assert (r.code, r.json["reason"]) == (2, "unknown_task_file"), r.out
    reported = {p["task_id"]: p for p in r.json["problems"]}
    assert set(reported) == {lost, "TASK-20200101-007"}
    assert reported[lost]["position"] == lost_from
    assert first not in reported


# -- the sealed chain head: deleting the newest events ----------------------------------------------------------
CREATE = ('{"type":"create_task","idempotency_key":"c1","payload":{"sender":"ADMIN","recipient":"PM",'
          '"subject":"s","body":"b"}}')


def amend(task_id: str, revision: int = 1, key: str = "a1") -> str:
    return json.dumps({"type": "amend", "task_id": task_id, "thread_key": task_id, "expected_revision": revision,
                       "round": 0, "idempotency_key": key, "payload": {"subject": f"changed {key}"}})


def execute(url: str, *statements: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for sql in statements:
            conn.exec_driver_sql(sql)
    engine.dispose()


def scalar(url: str, sql: str) -> object:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        value = conn.exec_driver_sql(sql).scalar()
    engine.dispose()
    return value


def head_row(url: str) -> str:
    value = scalar(url, "SELECT value FROM store_meta WHERE name = 'head'")
    assert isinstance(value, str)
    return value


def set_head(url: str, value: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE store_meta SET value = :v WHERE name = 'head'"), {"v": value})
    engine.dispose()


def workspace_on(tmp_path: Path, any_url: str) -> tuple[Path, str]:
    """A workspace on ``any_url``'s backend, and the URL an attacker holding its database would use."""
    root = tmp_path / "ws"
    pg = not any_url.startswith("sqlite")
    make_workspace(root, {}, database=any_url if pg else None)
    return root, any_url if pg else sqlite_url(root)


def assert_broken(r: Run, reason: str, position: int) -> None:
    """``reason`` is the verdict, and its first problem is at ``position`` (first_broken_position is the earliest
    of all problems, drift included)."""
    assert_clean(r)
    assert (r.code, r.json["status"], r.json["reason"]) == (2, "broken", reason), r.out
    assert min(p["position"] for p in r.json["problems"] if p["reason"] == reason) == position, r.out


def assert_repair_refused(root: Path, reason: str, position: int) -> None:
    r = run("verify", "--repair", cwd=root)
    assert_broken(r, reason, position)
    assert r.json["repaired"] == 0 and "refusing to repair" in r.err, (r.out, r.err)


def test_deleting_the_newest_events_is_hash_chain_and_repair_refuses(tmp_path: Path, any_url: str) -> None:
    """The reviewer's repro: create, amend, delete the amend's event."""
    root, url = workspace_on(tmp_path, any_url)
    task_id = run("submit", cwd=root, stdin=CREATE).json["task_id"]
    assert run("submit", cwd=root, stdin=amend(task_id)).json["revision"] == 2
    ok = run("verify", cwd=root)
    assert ok.code == 0 and ok.json["head"]["position"] == 2, ok.out
    execute(url, "DELETE FROM events WHERE global_pos = 2")
    assert_broken(run("verify", cwd=root), "hash_chain", 2)
    assert_repair_refused(root, "hash_chain", 2)
    assert scalar(url, f"SELECT revision FROM tasks WHERE task_id = '{task_id}'") == 2  # nothing laundered
    # a thorough attacker also removes what remembers the lost event: its receipt and the task row
    execute(url, "DELETE FROM receipts WHERE first_pos = 2", f"DELETE FROM tasks WHERE task_id = '{task_id}'")
    assert_broken(run("verify", cwd=root), "hash_chain", 2)
    assert_repair_refused(root, "hash_chain", 2)
    # ... and the head row: a keyed store without its head cannot prove where its log ends
    execute(url, "DELETE FROM store_meta WHERE name = 'head'")
    assert_broken(run("verify", cwd=root), "hash_chain", 2)
    assert_repair_refused(root, "hash_chain", 2)
    refused = run("submit", cwd=root, stdin=CREATE.replace('"c1"', '"c2"'))  # nothing is appended to it either
    assert refused.code == 2 and refused.json["reason"] == "hash_chain", (refused.out, refused.err)
    assert scalar(url, "SELECT count(*) FROM events") == 1


def test_a_head_row_rewritten_without_the_key_is_hash_chain(tmp_path: Path, any_url: str) -> None:
    root, url = workspace_on(tmp_path, any_url)
    kernel = workspace_kernel(root)
    for i in range(3):
        create(kernel, f"task {i}")
    kernel.db.dispose()
    original, events_ = head_row(url), rows(url)
    guessed = ChainKey(os.urandom(32))
    forgeries: dict[str, Callable[[int, str], str]] = {
        "legacy digest": legacy_head_seal,
        "hmac with a guessed key": guessed.head_seal,
        "the seal of the real head": lambda _pos, _hash: original.split(" ")[2],
    }
    # the log is intact but its head is rewritten (here: said to end one event earlier)
    for name, seal in forgeries.items():
        set_head(url, f"2 {events_[1][8]} {seal(2, events_[1][8])}")
        r = run("verify", cwd=root)
        assert (r.code, r.json["reason"], r.json["first_broken_position"]) == (2, "hash_chain", 4), (name, r.out)
    refused = run("submit", cwd=root, stdin=CREATE)  # appends refuse under an altered head
    assert refused.code == 2 and refused.json["reason"] == "hash_chain", (refused.out, refused.err)
    # the newest event deleted and the head rewritten to the new end with every seal the attacker can compute
    execute(url, "DELETE FROM events WHERE global_pos = 3")
    for name, seal in forgeries.items():
        set_head(url, f"2 {events_[1][8]} {seal(2, events_[1][8])}")
        r = run("verify", cwd=root)
        assert (r.code, r.json["reason"], r.json["first_broken_position"]) == (2, "hash_chain", 3), (name, r.out)
    set_head(url, "not a head at all")
    assert_broken(run("verify", cwd=root), "hash_chain", 3)
    assert_repair_refused(root, "hash_chain", 3)


def test_receipts_must_name_events_of_their_own_task(tmp_path: Path, any_url: str) -> None:
    root, url = workspace_on(tmp_path, any_url)
    kernel = workspace_kernel(root)
    ids = [create(kernel, f"task {i}") for i in range(3)]
    kernel.db.dispose()
    # a receipt of the second task pointed at the first task's event: the receipts table is not chained
    execute(url, f"UPDATE receipts SET first_pos = 1, last_pos = 1 WHERE task_id = '{ids[1]}'")
    r = run("verify", cwd=root)
    assert_broken(r, "receipt_mismatch", 1)
    assert r.json["problems"][0]["kind"] == "receipt" and r.json["problems"][0]["task_id"] == ids[1]
    assert_repair_refused(root, "receipt_mismatch", 1)
    # a receipt that answers for an event past the log's end: the log lost its tail
    execute(url, f"UPDATE receipts SET first_pos = 9, last_pos = 9 WHERE task_id = '{ids[1]}'")
    assert_broken(run("verify", cwd=root), "hash_chain", 4)
    assert_repair_refused(root, "hash_chain", 4)
    execute(url, f"UPDATE receipts SET first_pos = 2, last_pos = 2 WHERE task_id = '{ids[1]}'")
    assert run("verify", cwd=root).code == 0


def test_a_stored_task_ahead_of_its_events_is_not_laundered(tmp_path: Path, any_url: str) -> None:
    root, url = workspace_on(tmp_path, any_url)
    kernel = workspace_kernel(root)
    ids = [create(kernel, f"task {i}") for i in range(2)]
    kernel.db.dispose()
    execute(url, f"UPDATE tasks SET revision = 2 WHERE task_id = '{ids[0]}'")
    r = run("verify", cwd=root)
    assert_broken(r, "projection_ahead", 1)
    assert_repair_refused(root, "projection_ahead", 1)
    assert scalar(url, f"SELECT revision FROM tasks WHERE task_id = '{ids[0]}'") == 2
    # a stored task the log holds no event of at all
    execute(url, f"UPDATE tasks SET revision = 1 WHERE task_id = '{ids[0]}'",
            "INSERT INTO tasks (task_id, state, revision, round, parent, root, recipient, doc, last_pos) "
            "SELECT 'TASK-20200101-009', state, revision, round, parent, 'TASK-20200101-009', recipient, doc, 2 "
            f"FROM tasks WHERE task_id = '{ids[1]}'")
    assert_repair_refused(root, "projection_ahead", 2)
    # ordinary drift (the read model behind or beside its events) is still repaired
    execute(url, "DELETE FROM tasks WHERE task_id = 'TASK-20200101-009'",
            f"UPDATE tasks SET state = 'done' WHERE task_id = '{ids[1]}'")
    r = run("verify", "--repair", cwd=root)
    assert (r.code, r.json["repaired"]) == (0, 2), r.out


GROUP_WRITER = """
import sys, threading
from taskkernel.coordinator.cli.common import CliContext
from taskkernel.kernel.groupcommit import GroupCommitter
from taskkernel.kernel.model.principal import LOCAL_OWNER

root, name, threads, per = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
kernel = CliContext(workspace_path=root).kernel()
with GroupCommitter(kernel) as gc:
    def work(t):
        for i in range(per):
            cmd = {"type": "create_task", "idempotency_key": f"{name}-{t}-{i}",
                   "payload": {"sender": "ADMIN", "recipient": "PM", "subject": f"{name} {t} {i}"}}
            r = gc.submit(cmd, LOCAL_OWNER)
            assert r.status == "accepted", r
            r = gc.submit({"type": "amend", "task_id": r.task_id, "thread_key": r.task_id, "expected_revision": 1,
                           "round": 0, "idempotency_key": f"{name}-{t}-{i}-a", "payload": {"subject": "x"}},
                          LOCAL_OWNER)
            assert r.status == "accepted", r
    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
kernel.db.dispose()
"""


def test_many_writers_group_commit_and_processes_still_verify(tmp_path: Path, any_url: str) -> None:
    """The normal path: group-committing processes and CLI submits racing on one store leave a log that ends
    exactly at its sealed head."""
    root, url = workspace_on(tmp_path, any_url)
    assert run("verify", cwd=root).code == 0  # keys the store
    writers = [subprocess.Popen([sys.executable, "-c", GROUP_WRITER, str(root), f"g{w}", "4", "5"], cwd=root,
                                env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for w in range(3)]
    submits = [subprocess.Popen([*CLI, "submit"], cwd=root, env=cli_env(), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for i, p in enumerate(submits):
        out, err = p.communicate(CREATE.replace('"c1"', f'"cli{i}"'), timeout=180)
        assert p.returncode == 0, (out, err)
    for p in writers:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, (out, err)
    expected = 3 * 4 * 5 * 2 + 3
    r = run("verify", cwd=root)
    assert (r.code, r.json["events"], r.json["head"]["position"]) == (0, expected, expected), r.out
    assert scalar(url, "SELECT max(global_pos) FROM events") == expected


# -- file modes -------------------------------------------------------------------------------------------------
def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_database_files_and_chain_key_are_private_after_init_and_up(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    assert run("init", str(root), cwd=tmp_path).code == 0
    state = root / ".taskkernel"
    assert mode(state) == 0o700
    assert {p.name: mode(p) for p in state.iterdir() if p.name.startswith(("kernel.db", "chain.key"))} == {
        "kernel.db": 0o600, "chain.key": 0o600}
    # files an older version left world-readable are narrowed; hold the database open so -wal/-shm persist
    holder = sqlite3.connect(state / "kernel.db")
    holder.execute("CREATE TABLE IF NOT EXISTS holder (x)")
    for p in state.glob("kernel.db*"):
        p.chmod(0o644)
    assert run("up", "--once", cwd=root).code == 0
    found = {p.name: mode(p) for p in state.iterdir() if p.name.startswith("kernel.db")}
    holder.close()
    assert found == {"kernel.db": 0o600, "kernel.db-wal": 0o600, "kernel.db-shm": 0o600}
    loose = {str(p.relative_to(state)): oct(mode(p)) for p in state.rglob("*")
             if mode(p) & 0o077}  # the import lock, the CLI log, anything a later release adds
    assert not loose, loose


def test_a_private_directory_made_with_its_parents_makes_them_private_too(tmp_path: Path) -> None:
    from taskkernel.kernel.private import private_dir

    private_dir(tmp_path / "state" / "logs" / "runs")
    assert [mode(tmp_path / p) for p in ("state", "state/logs", "state/logs/runs")] == [0o700] * 3


# -- processes starting together ---------------------------------------------------------------------------------
def test_processes_starting_together_on_a_fresh_workspace_all_succeed(tmp_path: Path, any_url: str) -> None:
    root = tmp_path / "ws"
    init_workspace(root)
    database = "" if any_url.startswith("sqlite") else f"database = {any_url!r}\n"
    (root / "taskkernel.toml").write_text(f"[kernel]\ndurability = \"process\"\n{database}", encoding="utf-8")
    submit = '{{"type":"create_task","idempotency_key":"c{0}","payload":{{"sender":"ADMIN","recipient":"PM",' \
             '"subject":"concurrent {0}"}}}}'
    jobs = [(["init", str(root)], None), (["init", str(root)], None), (["up", "--once"], None),
            (["up", "--once"], None)] + [(["submit"], submit.format(i)) for i in range(3)]
    procs = [subprocess.Popen([*CLI, *args], cwd=root, env=cli_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for args, _ in jobs]
    results = [p.communicate(stdin, timeout=180) for p, (_, stdin) in zip(procs, jobs, strict=True)]
    for p, (args, _), (out, err) in zip(procs, jobs, results, strict=True):
        assert p.returncode == 0, (args, out, err)
    r = run("verify", cwd=root)
    assert (r.code, r.json["tasks"], r.json["chain"]) == (0, 3, "hmac-sha256"), r.out


def test_chain_links_are_standard_hmac_sha256() -> None:
    """The prepared-state fast path is RFC 2104 HMAC, so any tool holding the key can check the chain."""
    import hmac

    for size in (16, 32, 64, 100):
        key = os.urandom(size)
        fields = ("0" * 64, 7, "task:T", 2, "task_claimed", 1, '{"a":1}', "{}", "2026-01-01T00:00:00Z")
        body = "\x1f".join(map(str, fields)).encode()
        assert ChainKey(key).link(*fields) == hmac.new(key, body, hashlib.sha256).hexdigest()
