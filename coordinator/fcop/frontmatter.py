"""Front matter: split a file into fence + YAML + rest, load the YAML safely, append to it.

Loading composes with PyYAML's safe loader (the libyaml one when present) and constructs
the nodes in one walk hardened for hostile input: a size cap, a depth cap, no aliases/anchors (no
billion laughs), no duplicate keys, only the core schema's tags (no binary/set/omap/python), timestamps
kept as strings, and only a mapping at the top level. Appending rewrites only the YAML block: the bytes after the
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

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TAG = "tag:yaml.org,2002:"
_SAFE = yaml.constructor.SafeConstructor()
# The scalar tags the safe loader resolves, built as it builds them; a timestamp stays a string.
_SCALARS: dict[str, Any] = {
    f"{_TAG}null": _SAFE.construct_yaml_null, f"{_TAG}bool": _SAFE.construct_yaml_bool,
    f"{_TAG}int": _SAFE.construct_yaml_int, f"{_TAG}float": _SAFE.construct_yaml_float,
    f"{_TAG}timestamp": lambda node: str(node.value)}
_MERGE_KEYS = frozenset({f"{_TAG}merge", f"{_TAG}value"})
MAX_DEPTH = 900  # nesting of collections: below the recursion limit, about where PyYAML's own gave up


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


def _refused(node: yaml.Node, problem: str) -> yaml.constructor.ConstructorError:
    return yaml.constructor.ConstructorError(None, None, problem, node.start_mark)


def _construct(node: yaml.Node, seen: set[int], depth: int) -> Any:
    """The safe loader's construction in one recursive walk of the composed nodes (PyYAML's generic constructor
    costs ~30 Python calls a file): refuses aliases (a node met twice), tags other than the core schema's
    (binary, set, omap, pairs, python/…), non-scalar and duplicate keys, and nesting beyond ``MAX_DEPTH``."""
    if id(node) in seen:
        raise _refused(node, "YAML aliases are not allowed")
    seen.add(id(node))
    tag = node.tag
    if isinstance(node, yaml.ScalarNode):
        if tag == f"{_TAG}str":
            return node.value
        if tag not in _SCALARS:
            raise _refused(node, f"YAML tag {tag} is not allowed")
        return _SCALARS[tag](node)
    if depth >= MAX_DEPTH:
        raise _refused(node, f"front matter nests deeper than {MAX_DEPTH} levels")
    if isinstance(node, yaml.SequenceNode) and tag == f"{_TAG}seq":
        items = []
        for item in node.value:  # a loop, not a comprehension: one frame per level
            items.append(_construct(item, seen, depth + 1))
        return items
    if not isinstance(node, yaml.MappingNode) or tag != f"{_TAG}map":
        raise _refused(node, f"YAML tag {tag} is not allowed")
    if any(key.tag in _MERGE_KEYS for key, _ in node.value):
        _SAFE.flatten_mapping(node)  # `<<:` merges (of mappings written in place: an alias is refused above)
    mapping: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = _construct(key_node, seen, depth + 1)
        if not (key is None or isinstance(key, str | int | float | bool)):
            raise _refused(key_node, "mapping keys must be scalars")
        key = str(key)
        if key in mapping:
            raise _DuplicateKey(None, None, f"duplicate key {key!r}", key_node.start_mark)
        mapping[key] = _construct(value_node, seen, depth + 1)
    return mapping


def _check_graph(root: yaml.Node) -> None:
    """One iterative walk of the composed node graph before anything is constructed: refuses a node reached
    twice (an alias, or a cycle) and collections nested deeper than ``MAX_DEPTH``. ``<<:`` merges are flattened
    only after this, so flattening copies each node once (no billion laughs through merged aliases)."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:
            raise _refused(node, "YAML aliases are not allowed")
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            continue
        if depth >= MAX_DEPTH:
            raise _refused(node, f"front matter nests deeper than {MAX_DEPTH} levels")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, depth + 1) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.append((key, depth + 1))
                stack.append((value, depth + 1))


def _load(yaml_text: str) -> Any:
    loader = _Loader(yaml_text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node)
        return _construct(node, set(), 0)
    finally:
        loader.dispose()


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
        data = _load(yaml_text)
    except _DuplicateKey as exc:
        raise FcopError(FcopReason.DUPLICATE_KEY, f"front matter has a {exc.problem}") from exc
    except (yaml.YAMLError, LookupError, ValueError, TypeError, ArithmeticError, RecursionError,
            MemoryError) as exc:  # PyYAML's scalar constructors raise KeyError/IndexError on `!!bool maybe`, `!!int ''`
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
