"""Front matter: split a file into fence + YAML + rest, load the YAML safely, append to it.

Loading uses PyYAML's safe loader (the libyaml one when present) hardened for
hostile input: a size cap, no aliases/anchors (no billion laughs), no duplicate
keys, no binary/set/omap tags, timestamps kept as strings, and only a mapping
at the top level. Appending rewrites only the YAML block: the bytes after the
closing fence (the body) are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from taskkernel.coordinator.fcop.errors import FcopError, FcopReason

FENCE = "---"
BOM = "\ufeff"
MAX_FRONT_MATTER_CHARS = 64 * 1024

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _HardenedLoader(_Base):  # type: ignore[misc]
    """Safe loader that refuses aliases and duplicate keys and stringifies mapping keys."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        if node in self.constructed_objects:
            raise yaml.constructor.ConstructorError(None, None, "YAML aliases are not allowed", node.start_mark)
        return super().construct_object(node, deep)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[str, Any]:
        self.flatten_mapping(node)
        mapping: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not (key is None or isinstance(key, str | int | float | bool)):
                raise yaml.constructor.ConstructorError(None, None, "mapping keys must be scalars",
                                                        key_node.start_mark)
            key = str(key)
            if key in mapping:
                raise _DuplicateKey(None, None, f"duplicate key {key!r}", key_node.start_mark)
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


def _keep_scalar(loader: _HardenedLoader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))


def _refuse(loader: _HardenedLoader, node: yaml.Node) -> None:
    raise yaml.constructor.ConstructorError(None, None, f"YAML tag {node.tag} is not allowed", node.start_mark)


_HardenedLoader.add_constructor("tag:yaml.org,2002:timestamp", _keep_scalar)
for _tag in ("binary", "set", "omap", "pairs"):
    _HardenedLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse)


@dataclass(frozen=True)
class SplitText:
    """``head`` (opening fence line) + ``yaml`` + ``rest`` (closing fence line and body) == the text."""

    head: str
    yaml: str
    rest: str
    body: str
    newline: str


def split(text: str) -> SplitText | None:
    """Split a (BOM-free) document at its ``---`` fences; ``None`` if it has no front matter."""
    first_nl = text.find("\n")
    if first_nl < 0 or text[:first_nl].strip() != FENCE:
        return None
    newline = "\r\n" if text[first_nl - 1: first_nl] == "\r" else "\n"
    pos = first_nl + 1
    while pos <= len(text):
        nl = text.find("\n", pos)
        end = len(text) if nl < 0 else nl
        if text[pos:end].strip() == FENCE:
            body = "" if nl < 0 else text[nl + 1:]
            return SplitText(head=text[:first_nl + 1], yaml=text[first_nl + 1:pos], rest=text[pos:],
                             body=body, newline=newline)
        if nl < 0:
            return None
        pos = nl + 1
    return None


def load_mapping(yaml_text: str) -> dict[str, Any]:
    """Load a front-matter block into an ordered dict, or raise FcopError with a stable reason."""
    if len(yaml_text) > MAX_FRONT_MATTER_CHARS:
        raise FcopError(FcopReason.MALFORMED_FRONT_MATTER,
                        f"front matter is {len(yaml_text)} characters; the limit is {MAX_FRONT_MATTER_CHARS}")
    try:
        data = yaml.load(yaml_text, Loader=_HardenedLoader)  # noqa: S506 - hardened safe loader
    except _DuplicateKey as exc:
        raise FcopError(FcopReason.DUPLICATE_KEY, f"front matter has a {exc.problem}") from exc
    except (yaml.YAMLError, ValueError, TypeError, RecursionError, OverflowError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise FcopError(FcopReason.MALFORMED_FRONT_MATTER, f"front matter is not valid YAML: {detail}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FcopError(FcopReason.MALFORMED_FRONT_MATTER,
                        f"front matter must be a YAML mapping, got {type(data).__name__}")
    return data


def dump_mapping(mapping: dict[str, Any] | list[Any]) -> str:
    """The canonical block style fcop writes: insertion order, block style, UTF-8 kept."""
    return yaml.safe_dump(mapping, sort_keys=False, allow_unicode=True, default_flow_style=False)


def render(mapping: dict[str, Any], body: str) -> str:
    """A new file in fcop's canonical form: fence, YAML, fence, one blank line, body (if any)."""
    head = f"{FENCE}\n{dump_mapping(mapping)}{FENCE}\n"
    return f"{head}\n{body.lstrip(chr(10))}" if body else head


def append_list_item(text: str, key: str, item: dict[str, Any]) -> str:
    """Append ``item`` to the front-matter list ``key`` (created if absent), body untouched.

    The existing YAML text is kept byte for byte when the new entry can simply
    be added at the end (the key is absent, or is the last key holding a block
    list); the result is re-parsed and compared, and only if that check fails
    is the whole block re-dumped (key order and unknown keys still kept).
    """
    parts = split(text)
    if parts is None:
        raise FcopError(FcopReason.MISSING_FRONT_MATTER, "file has no front matter to append to")
    mapping = load_mapping(parts.yaml)
    current = mapping.get(key)
    if current is not None and not isinstance(current, list):
        raise FcopError(FcopReason.INVALID_FIELD_TYPE, f"{key!r} is a {type(current).__name__}, not a list")
    expected = dict(mapping)
    expected[key] = [*(current or []), item]
    candidate: str | None = None
    if key not in mapping:
        candidate = dump_mapping({key: [item]})
    elif list(mapping)[-1] == key and current:
        candidate = dump_mapping([item])
    new_yaml = None
    if candidate is not None:
        prefix = parts.yaml if parts.yaml.endswith("\n") or not parts.yaml else parts.yaml + parts.newline
        attempt = prefix + candidate.replace("\n", parts.newline)
        try:
            if load_mapping(attempt) == expected:
                new_yaml = attempt
        except FcopError:
            new_yaml = None
    if new_yaml is None:
        new_yaml = dump_mapping(expected).replace("\n", parts.newline)
    return parts.head + new_yaml + parts.rest
