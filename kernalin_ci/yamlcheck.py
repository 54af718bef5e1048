"""YAML documents checked against a JSON Schema, every error one line `FILE:LINE: KEY: message` (exit 2).

The one reader of the three YAML files a user writes: `.kernalin.yml` (config.py), a `--model` file and the
`model:` section (throughput/spec.py), the daemon's configuration (daemon/settings.py). Each declares its
keys, types and ranges as a schema; `check` validates a document with jsonschema and words the first error
in the file's order as a person reads it. What a schema cannot say (an op's params, a kernel named
elsewhere in the file) the reader checks itself and reports through `Document.error`, at the same lines.

    doc = yamlcheck.parse(text, ".kernalin.yml", empty="expected a 'kernels' list")
    yamlcheck.check(doc, SCHEMA)                      # UsageError: ".kernalin.yml:7: kernels[1].op: ..."
    raise doc.error(("kernels", 1, "name"), "duplicate kernel name 'a'")

A schema node may carry `x-message`: the words for any failure of that node's own value (`{value!r}` is
the value), in place of the generic ones; an object schema `x-required`: the words after "required".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kernalin_ci.errors import UsageError

Where = Sequence[str | int]  # a path into the document: keys and list indexes


def dotted(where: Where) -> str:
    """("kernels", 0, "op") -> "kernels[0].op"; () -> "(top level)"."""
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


@dataclass
class Document:
    path: str  # the file as the user named it (or a label: "--model llama-3.1-8b", "(defaults)")
    data: Any  # the plain value (dicts, lists, scalars)
    root: yaml.Node | None = None  # its nodes, for lines; None: no lines (settings given as a dict)

    def _node(self, where: Where, key: bool = False) -> yaml.Node | None:
        """The node at WHERE, or the nearest one above it that exists; KEY: a mapping entry's key node."""
        node = self.root
        for part in where:
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                hit = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
                if hit is None:
                    return node
                node = hit[0] if key and part is where[-1] else hit[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                node = node.value[part]
            else:
                return node
        return node

    def line(self, where: Where, key: bool = False) -> int | None:
        node = self._node(where, key)
        return node.start_mark.line + 1 if node is not None else None

    def error(self, where: Where, msg: str, *, key: bool = False, shown: Where | None = None) -> UsageError:
        """UsageError 'FILE:LINE: KEY: MSG' for the value at WHERE (KEY: at its key's line); SHOWN names it
        otherwise than WHERE (a --model file's keys are `model.KEY`)."""
        line = self.line(where, key)
        at = f"{self.path}:{line}" if line is not None else self.path
        return UsageError(f"{at}: {dotted(where if shown is None else shown)}: {msg}")


def parse(text: str, path: str, *, empty: str | None) -> Document:
    """TEXT as a Document: YAML errors, duplicate keys and keys that are not strings are UsageErrors with
    their line; an empty document is `FILE:1: EMPTY` (None: a Document of nothing)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise UsageError(f"{path}:{line}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    if root is None:
        if empty is None:
            return Document(path, None)
        raise UsageError(f"{path}:1: {empty}")
    _plain_keys(path, root, ())
    return Document(path, yaml.safe_load(text), root)


def load(path: str | Path, what: str, *, empty: str | None) -> Document:
    """The file PATH as a Document; one that cannot be read is a UsageError naming WHAT it should be."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UsageError(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{p}: not a text file (the {what} is YAML)") from None
    return parse(text, str(p), empty=empty)


def _plain_keys(path: str, node: yaml.Node, where: tuple) -> None:
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode) or k.tag != "tag:yaml.org,2002:str":
                raise UsageError(f"{path}:{k.start_mark.line + 1}: {dotted(where)}: keys must be plain strings")
            if k.value in seen:
                raise UsageError(f"{path}:{k.start_mark.line + 1}: {dotted((*where, k.value))}: duplicate key")
            seen.add(k.value)
            _plain_keys(path, v, (*where, k.value))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _plain_keys(path, item, (*where, i))


_KINDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "nothing",
}


def _words(e, doc: Document, at: Where) -> tuple[tuple, str, bool]:
    """A jsonschema error as (where, message, at the key's line)."""
    schema = e.schema if isinstance(e.schema, dict) else {}
    value = e.instance
    if e.validator == "additionalProperties":
        known = list(schema.get("properties", {}))
        extra = next(k for k in value if k not in known)
        return (*at, extra), f"unknown key (allowed: {', '.join(known)})", True
    if e.validator == "required":
        missing = next(k for k in e.validator_value if k not in value)
        return (*at, missing), "required" + (f" ({schema['x-required']})" if "x-required" in schema else ""), False
    if "x-message" in schema:
        return tuple(at), schema["x-message"].format(value=value), False
    if e.validator == "type":
        kinds = e.validator_value if isinstance(e.validator_value, list) else [e.validator_value]
        return tuple(at), f"expected {' or '.join(_KINDS.get(k, k) for k in kinds)}, got {value!r}", False
    if e.validator == "enum":
        return tuple(at), f"must be one of {', '.join(map(str, e.validator_value))}, got {value!r}", False
    if e.validator in ("minimum", "exclusiveMinimum") and e.validator_value == 0:
        return tuple(at), f"must be positive, got {value!r}", False
    if e.validator == "minItems":
        return tuple(at), "expected a non-empty list", False
    return tuple(at), e.message, False


def check(doc: Document, schema: dict, at: Where = (), shown: Where | None = None) -> None:
    """Validate the value at AT (default: the whole document) against SCHEMA; the first error in the file
    (the lowest line; on one line an unknown key before others, a missing one last; then the deepest key) is
    a UsageError. SHOWN: how AT is named in messages."""
    import jsonschema

    value = doc.data
    for part in at:
        value = value[part]
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if not errors:
        return
    found = []
    for e in errors:
        where, msg, key = _words(e, doc, (*at, *e.absolute_path))
        # on one line: an unknown key first (a misspelt key also makes a required one missing), a missing key last
        rank = {"additionalProperties": 0, "required": 2}.get(e.validator, 1)
        found.append((doc.line(where, key) or 0, rank, -len(where), where, msg, key))
    *_, where, msg, key = min(found, key=lambda f: f[:3])
    name = None if shown is None else (*shown, *where[len(at) :])
    raise doc.error(where, msg, key=key, shown=name)
