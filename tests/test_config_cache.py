"""The validated configuration's cache (docs/config.md, "The validated configuration's cache"): a command reads
the values of a taskkernel.toml this code validated before from .taskkernel/config-cache.json, keyed on the
file's exact bytes and the validating code; anything else about the cache means a full validation."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import taskkernel
from taskkernel.coordinator import config as config_module
from taskkernel.coordinator import workspace as workspace_module
from taskkernel.coordinator.config import CheckedConfig, ConfigError, Isolation, load_config, parse_config
from taskkernel.coordinator.config_template import config_template
from taskkernel.coordinator.workspace import CONFIG_CACHE_NAME, CONFIG_NAME, STATE_DIR, Workspace, init_workspace
from tests.test_config import uncommented


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_workspace(tmp_path / "ws").workspace.root  # its load wrote the cache


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files a load validated (a cache hit validates none)."""
    seen: list[Path] = []
    real = workspace_module.validate_bytes

    def counted(raw: bytes, path: Path) -> Any:
        seen.append(path)
        return real(raw, path)

    monkeypatch.setattr(workspace_module, "validate_bytes", counted)
    return seen


def cache_of(root: Path) -> Path:
    return root / STATE_DIR / CONFIG_CACHE_NAME


def test_a_validated_file_is_read_from_the_cache_until_a_byte_changes(root: Path, validations: list[Path]) -> None:
    cache = cache_of(root)
    assert cache.stat().st_mode & 0o777 == 0o600
    ws = Workspace.load(root)
    assert validations == [] and ws.require_token and ws.durability == "full"
    assert ws.database_url == f"sqlite:///{root / STATE_DIR / 'kernel.db'}"
    config = root / CONFIG_NAME
    text = config.read_text()
    before = config.stat()
    config.write_text(text + "\n[mcp]\noutput_budget = 2048\n")
    edited = Workspace.load(root)
    assert validations == [config] and edited.config.mcp.output_budget == 2048
    shown = config.stat()
    config.write_text(text + "\n[mcp]\noutput_budget = 8192\n")  # the same size, put back to the same mtime
    os.utime(config, ns=(before.st_atime_ns, shown.st_mtime_ns))
    assert (config.stat().st_size, config.stat().st_mtime_ns) == (shown.st_size, shown.st_mtime_ns)
    assert Workspace.load(root).config.mcp.output_budget == 8192 and len(validations) == 2


def test_an_invalid_edit_is_reported_exactly_as_without_a_cache(root: Path, validations: list[Path]) -> None:
    config = root / CONFIG_NAME
    good = config.read_bytes()
    config.write_bytes(good + b"\n[kernel2]\nmax_runs = 2\n")
    with pytest.raises(ConfigError) as cached:
        Workspace.load(root)
    cache_of(root).unlink()
    with pytest.raises(ConfigError) as plain:
        load_config(config)
    assert cached.value.as_json() == plain.value.as_json() and cached.value.message == plain.value.message
    assert cached.value.code == "config_invalid" and cached.value.as_json()["line"] == good.count(b"\n") + 2
    assert not cache_of(root).exists(), "a file that does not validate is never cached"
    config.write_bytes(good)
    Workspace.load(root)
    assert cache_of(root).exists() and len(validations) == 2


def tamper(root: Path, change: Any) -> None:
    doc = json.loads(cache_of(root).read_text())
    change(doc)
    cache_of(root).write_text(json.dumps(doc))


@pytest.mark.parametrize("damage", [
    lambda root: cache_of(root).write_bytes(b"\x00not json"),
    lambda root: cache_of(root).write_text("[]"),
    lambda root: tamper(root, lambda d: d.update(payload=d["payload"].replace("true", "false"))),  # digest fails
    lambda root: tamper(root, lambda d: d.update(key="0" * 64)),  # another file's
    lambda root: tamper(root, lambda d: d.update(format="taskkernel-config-cache/0")),
    lambda root: cache_of(root).chmod(0o644),  # not the owner's private file
])
def test_a_damaged_or_foreign_cache_is_ignored_and_rewritten(root: Path, validations: list[Path], damage: Any) -> None:
    damage(root)
    ws = Workspace.load(root)
    assert validations == [root / CONFIG_NAME] and ws.require_token
    assert cache_of(root).stat().st_mode & 0o777 == 0o600
    Workspace.load(root)
    assert len(validations) == 1, "rewritten whole: the next load is a hit"


def test_other_validating_code_means_another_key(root: Path, validations: list[Path],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(taskkernel, "__version__", "0.0.0+another")
    workspace_module._code_stamp.cache_clear()  # a new process: it stamps the code it finds
    try:
        Workspace.load(root)
        assert validations == [root / CONFIG_NAME]
    finally:
        workspace_module._code_stamp.cache_clear()


def test_a_process_whose_code_was_replaced_meanwhile_writes_nothing(root: Path, validations: list[Path],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-running process validates with the code it loaded: after an upgrade on disk its validation must not
    land under the new code's key (a new process would take it for its own)."""
    config = root / CONFIG_NAME
    cache_of(root).unlink()
    monkeypatch.setattr(workspace_module, "_code_digest", lambda: "the code installed since")
    config.write_bytes(config.read_bytes() + b"\n[mcp]\noutput_budget = 2048\n")
    assert Workspace.load(root).config.mcp.output_budget == 2048 and validations == [config]
    assert not cache_of(root).exists()


def test_cached_values_the_models_no_longer_take_are_validated_in_full(root: Path, validations: list[Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole and for this key, yet not what the models need (a field the code added since): validated, not an
    internal error."""
    real = config_module.validate_bytes
    monkeypatch.setattr(config_module, "validate_bytes", lambda raw, path: validations.append(path) or real(raw, path))
    def drop_a_field(doc: dict[str, Any]) -> None:
        payload = json.loads(doc["payload"])
        del payload["values"]["kernel"]["max_runs"]
        doc["payload"] = json.dumps(payload, separators=(",", ":"))
        doc["sha256"] = hashlib.sha256(doc["payload"].encode()).hexdigest()

    tamper(root, drop_a_field)
    ws = Workspace.load(root)
    assert validations == []
    assert ws.config.kernel.max_runs > 0 and validations == [root / CONFIG_NAME]


def test_a_fifo_in_the_cache_s_place_is_ignored_not_waited_on(root: Path, validations: list[Path]) -> None:
    cache_of(root).unlink()
    os.mkfifo(cache_of(root), 0o600)
    assert Workspace.load(root).require_token and validations == [root / CONFIG_NAME]


def test_the_cache_lives_only_in_the_workspace_s_own_state_folder(tmp_path: Path, validations: list[Path]) -> None:
    """An agent can write the FCoP folders, not .taskkernel/: a state folder that is a symlink (to somewhere an
    agent writes) is neither read nor written, and no state folder is made for the cache."""
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / CONFIG_NAME).write_text(config_template())
    Workspace.load(bare)
    assert not (bare / STATE_DIR).exists()
    elsewhere = tmp_path / "agent-writable"
    elsewhere.mkdir()
    (bare / STATE_DIR).symlink_to(elsewhere)
    Workspace.load(bare)
    Workspace.load(bare)
    assert list(elsewhere.iterdir()) == [] and len(validations) == 3


def same(a: Any, b: Any, where: str = "config") -> None:
    """Equal values of the same types, models with the same fields set and private attributes."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, BaseModel):
        assert a.model_fields_set == b.model_fields_set, where
        assert a.__pydantic_private__ == b.__pydantic_private__, where
        for name in type(a).model_fields:
            same(getattr(a, name), getattr(b, name), f"{where}.{name}")
    elif isinstance(a, dict | list):
        assert len(a) == len(b), where
        for (k, x), (j, y) in zip(a.items() if isinstance(a, dict) else enumerate(a),
                                  b.items() if isinstance(b, dict) else enumerate(b), strict=True):
            assert k == j, where
            same(x, y, f"{where}[{k!r}]")
    else:
        assert a == b, where


def test_the_models_rebuilt_from_the_cache_are_the_validated_ones() -> None:
    """Every table and key of the template turned on, a profile of the file's own and a role running it."""
    text = uncommented(config_template()) + (
        '\n[profiles.own-cli]\nprogram = "own-cli"\nmcp_format = "none"\noutput = "stream-json"\n'
        '[profiles.own-cli.variants.fast]\nmodel = "small"\n'
        '\n[roles.WRITER]\nrunner = "own-cli"\nvariant = "fast"\nisolation = "shared"\n')
    validated = parse_config(text)
    rebuilt = CheckedConfig.from_plain(json.loads(json.dumps(CheckedConfig.of(validated).plain()))).config
    same(rebuilt, validated)
    assert rebuilt == validated and rebuilt.roles["WRITER"].isolation is Isolation.SHARED
    assert rebuilt.roles["WRITER"].profile is rebuilt.profiles["own-cli"]
    assert rebuilt.line_of("roles.WRITER", "variant") == validated.line_of("roles.WRITER", "variant") is not None
