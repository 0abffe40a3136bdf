"""`taskkernel invite` and `taskkernel join`: how a new host gets the two secrets its workspace needs to act on a
shared store (docs/hosts.md#joining-a-host): the event chain's HMAC key and the owner's credential. They travel in
a bundle file the owner copies (scp -p), never through the database: whoever can read the store must not learn the
key that proves it was not rewritten, nor a credential that acts as the owner."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import typer

from taskkernel.coordinator.cli.common import Exit, emit, fail, get_ctx, reject, say

BUNDLE_FORMAT = "taskkernel-join/1"
DEFAULT_BUNDLE = "join-bundle.json"  # in the workspace's .taskkernel/ (0700, never committed)


def invite(ctx: typer.Context, out: Path = typer.Option(
        None, "--out", help=f"Where to write the bundle (default: .taskkernel/{DEFAULT_BUNDLE}, outside the "
                            "repository's files); never overwritten.")) -> None:
    """Write a join bundle for a new host: this workspace's chain key and owner credential (unscoped ADMIN)."""
    from taskkernel.kernel.private import read_private, write_private
    from taskkernel.kernel.store.chain import ChainKey

    c = get_ctx(ctx)
    ws = c.workspace()
    c.require_admin("inviting a host (its bundle holds the owner's credential)")
    try:
        key = read_private(ws.chain_key_path).decode("ascii").strip()
        token = read_private(ws.owner_token_path).decode("ascii").strip()
    except FileNotFoundError as exc:
        fail(Exit.USAGE, f"{exc.filename} is missing: invite from the workspace that holds the store's chain key and "
                         "owner credential", error="join_source_incomplete")
    target = out or ws.state_dir / DEFAULT_BUNDLE
    bundle = {"format": BUNDLE_FORMAT, "chain_key": key, "owner_token": token,
              "key_id": ChainKey(bytes.fromhex(key)).key_id}
    try:
        write_private(target, (json.dumps(bundle, indent=2) + "\n").encode("ascii"))
    except FileExistsError:
        fail(Exit.USAGE, f"{target} exists: remove it or name another file with --out", error="bundle_exists")
    emit({"status": "ok", "bundle": str(target), "key_id": bundle["key_id"]}, lambda _: say(
        f"wrote {target} (0600): copy it to the new host (scp -p), run `taskkernel join {target.name}` in that "
        "host's workspace, then delete both copies"))


def join(ctx: typer.Context, bundle: Path = typer.Argument(..., help="The bundle `taskkernel invite` wrote."),
         workspace: Path = typer.Argument(None, help="The workspace to join (default: search upwards).")) -> None:
    """Give this host's workspace the shared store's chain key and owner credential from a join bundle."""
    from taskkernel.kernel.private import private_dir, read_private, write_private

    c = get_ctx(ctx)
    if workspace is not None:
        c.workspace_path = str(workspace)
    ws = c.workspace()
    values = _read_bundle(bundle)
    private_dir(ws.state_dir)
    wanted = ((ws.chain_key_path, values["chain_key"]), (ws.owner_token_path, values["owner_token"]))
    for path, value in wanted:  # both checked before either is written: a refusal changes nothing
        try:
            held = read_private(path).decode("ascii", "replace").strip()
        except FileNotFoundError:
            continue
        if held != value:
            reject("join_conflict", f"{path} already holds another value: this workspace belongs to another store "
                   "(move the file aside, keeping it, to join this one)", file=str(path))
    wrote = []
    for path, value in wanted:
        with contextlib.suppress(FileExistsError):  # the same value, checked above
            write_private(path, (value + "\n").encode("ascii"))
            wrote.append(path.name)
    emit({"status": "ok", "workspace": str(ws.root), "wrote": wrote, "key_id": values["key_id"]}, lambda _: say(
        f"joined: {', '.join(wrote) or 'nothing new'} in {ws.state_dir}; delete {bundle} now"))


def _read_bundle(path: Path) -> dict[str, Any]:
    """The bundle's values; refused (exit 64) unless it is a private regular file of the right shape."""
    from taskkernel.kernel.credentials import well_formed
    from taskkernel.kernel.store.chain import ChainKey

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO never blocks
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise OSError(f"{path} is not a regular file")
            if mode & 0o077:
                fail(Exit.USAGE, f"{path} can be read by others (mode {stat.S_IMODE(mode):o}): it holds the "
                                 f"owner's credential; chmod 600 {path} first", error="bundle_exposed")
            text = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        data = json.loads(text)
        key, token, key_id = data["chain_key"], data["owner_token"], data["key_id"]
        if data.get("format") != BUNDLE_FORMAT or not all(isinstance(v, str) for v in (key, token, key_id)):
            raise ValueError("not a join bundle")
        if ChainKey(bytes.fromhex(key)).key_id != key_id:
            raise ValueError("its chain key does not match its key id")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        fail(Exit.USAGE, f"{path} is not a join bundle `taskkernel invite` wrote: {exc}", error="invalid_bundle")
    if not well_formed(token):
        fail(Exit.USAGE, f"{path} holds no well-formed owner credential", error="invalid_bundle")
    return {"chain_key": key, "owner_token": token, "key_id": key_id}
