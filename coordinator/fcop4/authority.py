"""The Profile ``taskkernel-authority/1``: how a G4 workspace learns that the kernel decided a T4–T7 edge.

fcop's Core completes approve, reject, reopen and archive only with an authorization REVIEW whose ``issuer_proof``
a trusted evaluator, given to the Core at start-up, accepts for a Profile the workspace manifest adopts. Ours
accepts a proof only if it carries an HMAC-SHA256, under the workspace's profile key, of the Profile, the issuer
and a fresh nonce: only the coordinator, which holds the key (``.taskkernel/fcop4-profile.key``, 0600, never in
the workspace or the database), can make one, and it makes one only for a decision the kernel accepted. An fcop
agent can read such a REVIEW but cannot mint another.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from taskkernel.coordinator.fcop import safeio
from taskkernel.kernel.private import private_dir, write_private

PROFILE_ID = "taskkernel-authority/1"
PROOF_METHOD = "taskkernel-hmac-sha256"
KEY_FILE = "fcop4-profile.key"


def profile_key(state_dir: Path) -> bytes:
    """The workspace's profile key, made (32 random bytes, hex, 0600) the first time it is needed."""
    path = state_dir / KEY_FILE
    if not path.exists():
        private_dir(state_dir)
        with contextlib.suppress(FileExistsError):  # another process made it first: theirs stands
            write_private(path, secrets.token_hex(32).encode("ascii") + b"\n")
    return bytes.fromhex(path.read_text(encoding="ascii").strip())


def _mac(key: bytes, profile_ref: str, issuer: str, nonce: str) -> str:
    return hmac.new(key, f"{profile_ref}\n{issuer}\n{nonce}".encode(), hashlib.sha256).hexdigest()


def issuer_proof(key: bytes, issuer: str) -> dict[str, str]:
    """A proof the evaluator accepts, for one authorization REVIEW ``issuer`` signs."""
    nonce = secrets.token_hex(16)
    return {"method": PROOF_METHOD, "nonce": nonce, "mac": _mac(key, PROFILE_ID, issuer, nonce)}


def evaluator(key: bytes) -> Callable[..., str]:
    """The trusted evaluator fcop's Core calls: ``AUTHORIZED`` for a proof made with ``key``, else ``DENIED``."""
    def evaluate(*, profile_ref: str, issuer: str, proof: Any) -> str:
        if not isinstance(proof, Mapping) or proof.get("method") != PROOF_METHOD:
            return "DENIED"
        nonce, mac = proof.get("nonce"), proof.get("mac")
        if not isinstance(nonce, str) or not isinstance(mac, str) or not isinstance(issuer, str):
            return "DENIED"
        ok = hmac.compare_digest(mac, _mac(key, profile_ref, issuer, nonce))
        return "AUTHORIZED" if ok and profile_ref == PROFILE_ID else "DENIED"
    return evaluate


def adopt_profile(fcop_root: Path) -> bool:
    """Add the kernel's Profile to the manifest's ``profiles`` (canonical JSON + LF, as fcop writes it); True if it
    was added. Without it the Core refuses every T4–T7 with AUTHORIZATION_PROFILE_UNAVAILABLE."""
    from fcop.v4.encoding import canonical

    path = fcop_root / "fcop.json"
    raw, _ = safeio.read_bytes(path, 1 << 20)
    manifest = json.loads(raw)
    profiles = manifest.get("profiles")
    if not isinstance(profiles, list) or PROFILE_ID in profiles:
        return False
    manifest["profiles"] = [*profiles, PROFILE_ID]
    safeio.rewrite(path, canonical(manifest) + b"\n", expect_sha256=hashlib.sha256(raw).hexdigest())
    return True


def core(project_root: Path, key: bytes) -> Any:
    """fcop's Core over the project (its workspace is ``<project>/fcop``), trusting the kernel's Profile."""
    from fcop import Project

    return Project(project_root, trusted_profiles={PROFILE_ID: evaluator(key)})
