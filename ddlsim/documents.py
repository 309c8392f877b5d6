"""Parse a YAML or JSON document strictly and within bounds, or refuse it in one paragraph.

The YAML loader is PyYAML's safe loader with four guards:

* a duplicate key in a mapping is refused, naming the key and both lines (PyYAML keeps the
  last one silently);
* nesting deeper than :data:`MAX_DEPTH` is refused: flow brackets (``[[[…``) by a scan of the
  text before parsing (PyYAML's scanner is quadratic in their depth), block nesting while
  composing (before Python's recursion limit is reached);
* a document of more than :data:`MAX_NODES` values is refused while composing;
* aliases are counted, and a document whose *expanded* size (every alias counted as a copy
  of what it names) exceeds :data:`MAX_NODES` is refused before it is constructed: a
  "billion laughs" bomb of a few hundred bytes is refused in milliseconds;
* numbers written ``1e9`` (no dot) are read as numbers, as YAML 1.2 and JSON read them,
  rather than as strings.

JSON is parsed with duplicate keys and the non-standard constants ``NaN``/``Infinity``
refused. Errors are :class:`DocumentError` naming the file and the line.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode

from .errors import ConfigError

__all__ = ["DocumentError", "load_bundled_yaml", "parse_yaml", "parse_json", "parse_document",
           "MAX_DEPTH", "MAX_NODES", "MAX_ALIASES"]

#: Deepest nesting of mappings and lists (a run config nests 4 levels; 50 leaves room for any
#: hand-written or generated file while staying far below Python's recursion limit of 1000).
MAX_DEPTH = 50
#: Largest document, in values after alias expansion: a full run config has ~100, one with an
#: explicit placement of 16,384 ranks ~16,500. PyYAML (pure Python) composes ~10^4 values a
#: second, so a refusal takes at most ~2 s.
MAX_NODES = 20_000
#: Most aliases in one document (a config that uses anchors uses a handful).
MAX_ALIASES = 1_000


class DocumentError(ConfigError):
    """A file is not a well-formed YAML/JSON document within ddlsim's bounds.

    ``line`` is the 1-based line of the problem when known; ``detail`` the message without
    the file name (for callers that name the file their own way, as ``FILE:LINE``).
    """

    def __init__(self, message: str, *, line: int | None = None, detail: str | None = None):
        super().__init__(message)
        self.line, self.detail = line, detail or message


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, deep nesting, alias bombs (see module doc)."""

    def __init__(self, stream: str, name: str, max_nodes: int = MAX_NODES):
        super().__init__(stream)
        self.name, self.depth, self.aliases, self.nodes = name, 0, 0, 0
        self.max_nodes = max_nodes

    def fail(self, mark: Any, message: str) -> DocumentError:
        line = f", line {mark.line + 1}" if mark is not None else ""
        return DocumentError(f"{self.name}{line}: {message}")

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise self.fail(self.peek_event().start_mark,
                                f"more than {MAX_ALIASES} aliases (*name); ddlsim refuses "
                                "documents that could expand without bound")
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise self.fail(self.peek_event().start_mark,
                            f"holds more than {self.max_nodes:,} values, more than ddlsim reads "
                            "from one document of this kind")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(self.peek_event().start_mark,
                            f"nested more than {MAX_DEPTH} levels deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_document(self) -> Node:
        node = super().compose_document()
        _check_expanded(node, self)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                raise self.fail(key_node.start_mark, "a mapping key must be a plain value, "
                                "not a list or mapping") from None
            if first is not None:
                raise self.fail(key_node.start_mark, f"duplicate key {key!r} (first given on "
                                f"line {first + 1}); each key may appear once")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


# YAML 1.2 / JSON floats without a dot ("1e9", "-2E+3"), which YAML 1.1 reads as strings.
_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789"))


def _check_expanded(root: Node | None, loader: _BoundedLoader) -> None:
    """Refuse a node graph whose size with every alias expanded exceeds ``loader.max_nodes``, or
    that contains itself; iterative, memoised on node identity (aliases share nodes)."""
    if root is None:
        return
    size: dict[int, int] = {}
    stack: list[tuple[Node, bool]] = [(root, False)]
    open_: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = _children(node)
        if done:
            open_.discard(key)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            if size[key] > loader.max_nodes:
                raise loader.fail(node.start_mark,
                                  f"expands to more than {loader.max_nodes:,} values through aliases "
                                  "(*name); ddlsim refuses such documents (a \"billion "
                                  "laughs\" bomb would take unbounded memory)")
            continue
        if key in size:
            continue
        if key in open_:
            raise loader.fail(node.start_mark, "an alias refers to a list or mapping that "
                              "contains it; recursive documents are not allowed")
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in size)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


_QUOTED_OR_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\n]|\'\')*\'|#[^\n]*')


def _flow_depth(text: str) -> tuple[int, int]:
    """Deepest nesting of ``[``/``{`` outside quotes and comments, and the line where it is
    first reached: PyYAML's scanner takes time quadratic in it, so it is checked first."""
    kept = _QUOTED_OR_COMMENT.sub(lambda m: "\n" * m.group().count("\n"), text)
    raw = np.frombuffer(kept.encode("utf-8"), dtype=np.uint8)
    step = np.isin(raw, (ord("["), ord("{"))).astype(np.int64) - np.isin(raw, (ord("]"), ord("}")))
    if not len(step):
        return 0, 0
    depth = np.cumsum(step)
    at = int(np.argmax(depth))
    return int(depth[at]), int(np.count_nonzero(raw[:at] == ord("\n"))) + 1


def load_bundled_yaml(text: str) -> Any:
    """A YAML file shipped in ``ddlsim.data`` (trusted: no bounds), parsed by libyaml's C
    loader when PyYAML has it (the same values as ``yaml.safe_load``, about 10× faster: a
    prediction reads several presets files), else by ``yaml.safe_load``."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def parse_yaml(text: str, name: str, *, max_nodes: int = MAX_NODES) -> Any:
    """The YAML document in ``text`` (``name`` is the file, for messages); ``max_nodes``
    bounds its values after alias expansion (data files such as calibration profiles pass a
    larger bound than a run config's).

    Raises
    ------
    DocumentError
        Naming the file and line: syntax errors, duplicate keys, nesting deeper than
        :data:`MAX_DEPTH`, alias expansion beyond :data:`MAX_NODES`, several documents.
    """
    depth, line = _flow_depth(text)
    if depth > MAX_DEPTH:
        raise DocumentError(f"{name}, line {line}: nested more than {MAX_DEPTH} levels deep")
    try:
        loader = _BoundedLoader(text, name, max_nodes)
    except yaml.YAMLError as exc:  # the reader refuses control characters before parsing
        raise DocumentError(f"{name}: not valid YAML: {str(exc).splitlines()[0]} (at offset "
                            f"{getattr(exc, 'position', '?')})") from None
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(x for x in (exc.context, exc.problem) if x)
        raise loader.fail(mark, f"not valid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise DocumentError(f"{name}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except (RecursionError, MemoryError, OverflowError, ValueError) as exc:
        if isinstance(exc, DocumentError):
            raise
        raise DocumentError(f"{name}: not a YAML document ddlsim can read "
                            f"({type(exc).__name__}: {exc})") from None
    finally:
        loader.dispose()


def _json_error(name: str, detail: str) -> DocumentError:
    return DocumentError(f"{name}: {detail}", detail=detail)


def _pairs(name: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out: dict = {}
        for key, value in pairs:
            if key in out:
                raise _json_error(name, f"duplicate key {key!r} in a JSON object; each key "
                                  "may appear once")
            out[key] = value
        return out
    return hook


def _constant(name: str):
    def refuse(word: str) -> float:
        raise _json_error(name, f"{word} is not a number JSON allows; give a finite number")
    return refuse


def _finite(name: str):
    def read(word: str) -> float:
        value = float(word)
        if not math.isfinite(value):
            raise _json_error(name, f"the number {word} is too large to be a float; give a "
                              "finite number")
        return value
    return read


def _shape(value: Any) -> tuple[int, int]:
    """Nesting depth of lists and mappings, and the number of values, without recursion."""
    deepest, count, stack = 0, 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            kids = item.values() if isinstance(item, dict) else item
            stack.extend((x, depth + 1) for x in kids)
    return deepest, count


def parse_json(text: str, name: str, *, max_nodes: int = MAX_NODES,
               allow_nan: bool = False) -> Any:
    """The JSON document in ``text``; duplicate keys, NaN/Infinity, numbers that overflow a
    float, nesting deeper than :data:`MAX_DEPTH` and more than ``max_nodes`` values are
    refused. ``allow_nan`` keeps ``NaN``/``Infinity`` as floats, for data files whose readers
    skip and report such rows one by one (nccl-tests' JSON).

    Raises
    ------
    DocumentError
        Naming the file, the line and column.
    """
    too_deep = False
    try:
        special = {} if allow_nan else {"parse_constant": _constant(name),
                                        "parse_float": _finite(name)}
        data = json.loads(text, object_pairs_hook=_pairs(name), **special)
    except json.JSONDecodeError as exc:
        detail = f"not valid JSON: {exc.msg} (column {exc.colno})"
        raise DocumentError(f"{name}, line {exc.lineno}: {detail}", line=exc.lineno,
                            detail=detail) from None
    except RecursionError:
        too_deep = True
    depth, count = (MAX_DEPTH + 1, 0) if too_deep else _shape(data)
    if depth > MAX_DEPTH:
        raise _json_error(name, f"nested more than {MAX_DEPTH} levels deep")
    if count > max_nodes:
        raise _json_error(name, f"holds more than {max_nodes:,} values, more than ddlsim "
                          "reads from one document of this kind")
    return data


def parse_document(text: str, name: str, json_format: bool) -> Any:
    """JSON (``json_format``) or YAML text, parsed as described above."""
    return parse_json(text, name) if json_format else parse_yaml(text, name)
