"""GitHub's official OpenAPI description: find an operation for a request and validate it.

The description is `shared/github-openapi/api.github.com.json.gz` (OpenAPI 3.0.3,
beside the repository or inside it; `KERNALIN_GITHUB_OPENAPI` overrides the path).
It is loaded once per process. Schemas are OpenAPI 3.0 dialect (`nullable`,
`readOnly`/`writeOnly`), validated with openapi-schema-validator: request bodies
with the write validator and format checks, responses with the read validator.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from jsonschema.validators import extend
from openapi_schema_validator import OAS30ReadValidator, OAS30WriteValidator, oas30_format_checker

_ENUM = OAS30ReadValidator.VALIDATORS["enum"]


def _nullable_enum(validator, enums, instance, schema):
    # GitHub sends null for a `nullable` enum (a check run's conclusion while in progress) although
    # null is not listed in the enum; OpenAPI 3.0.3 lets `nullable` add null to the allowed values.
    if instance is None and schema.get("nullable"):
        return
    yield from _ENUM(validator, enums, instance, schema)


_ReadValidator = extend(OAS30ReadValidator, {"enum": _nullable_enum})
_WriteValidator = extend(OAS30WriteValidator, {"enum": _nullable_enum})

SPEC_ENV = "KERNALIN_GITHUB_OPENAPI"
_SPEC_NAME = Path("shared") / "github-openapi" / "api.github.com.json.gz"
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def spec_path() -> Path:
    """Where the description is: $KERNALIN_GITHUB_OPENAPI, else shared/ inside or beside the repository."""
    if os.environ.get(SPEC_ENV):
        return Path(os.environ[SPEC_ENV])
    repo = Path(__file__).resolve().parents[2]
    for candidate in (repo / _SPEC_NAME, repo.parent / _SPEC_NAME):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"GitHub's OpenAPI description not found at {repo / _SPEC_NAME} or {repo.parent / _SPEC_NAME}; "
        f"set {SPEC_ENV} to its path"
    )


@dataclass(frozen=True)
class Operation:
    method: str  # upper case
    template: str  # e.g. /repos/{owner}/{repo}/check-runs
    operation_id: str
    spec: dict = field(repr=False)  # the operation object, $refs not resolved


@dataclass
class Match:
    operation: Operation
    path_params: dict[str, str]


class _Node:
    __slots__ = ("literal", "param", "param_name", "templates")

    def __init__(self):
        self.literal: dict[str, _Node] = {}
        self.param: _Node | None = None
        self.param_name: str | None = None
        self.templates: dict[str, Operation] = {}  # method -> operation


class OpenAPI:
    """The description, a path-template matcher and cached validators."""

    def __init__(self, spec: dict):
        self.spec = spec
        self._root = _Node()
        self._validators: dict[tuple, object] = {}
        self._lock = threading.Lock()
        for template, item in spec["paths"].items():
            node = self._root
            for seg in template.strip("/").split("/"):
                if seg.startswith("{") and seg.endswith("}"):
                    if node.param is None:
                        node.param = _Node()
                    node.param_name = seg[1:-1]
                    node = node.param
                else:
                    node = node.literal.setdefault(seg, _Node())
            for method, op in item.items():
                if method in _METHODS:
                    node.templates[method.upper()] = Operation(method.upper(), template, op.get("operationId", ""), op)

    @classmethod
    @functools.cache
    def load(cls, path: str | None = None) -> OpenAPI:
        p = Path(path) if path else spec_path()
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt", encoding="utf-8") as f:
            return cls(json.load(f))

    # -- matching ---------------------------------------------------------------------------------
    def find(self, method: str, path: str) -> tuple[Match | None, bool]:
        """(match, path_exists): the operation for METHOD PATH; literal segments win over parameters.

        path_exists is True when some template matches the path (a wrong method, then, when match is None).
        """
        segs = path.strip("/").split("/") if path.strip("/") else []
        exists = False
        for node, params in self._walk_all(self._root, segs, 0, {}):
            exists = True
            op = node.templates.get(method.upper())
            if op is not None:
                return Match(op, params), True
        return None, exists

    def _walk_all(self, node: _Node, segs: list[str], i: int, params: dict):
        if i == len(segs):
            if node.templates:
                yield node, dict(params)
            return
        seg = segs[i]
        child = node.literal.get(seg)
        if child is not None:
            yield from self._walk_all(child, segs, i + 1, params)
        if node.param is not None and seg != "":
            params[node.param_name] = seg
            yield from self._walk_all(node.param, segs, i + 1, params)
            del params[node.param_name]

    # -- $ref and parameters ----------------------------------------------------------------------
    def resolve(self, obj: dict) -> dict:
        while isinstance(obj, dict) and "$ref" in obj:
            ref = obj["$ref"]
            assert ref.startswith("#/"), ref
            target = self.spec
            for part in ref[2:].split("/"):
                target = target[part.replace("~1", "/").replace("~0", "~")]
            obj = target
        return obj

    def parameters(self, op: Operation) -> list[dict]:
        item = self.spec["paths"][op.template]
        params = [self.resolve(p) for p in item.get("parameters", [])]
        params += [self.resolve(p) for p in op.spec.get("parameters", [])]
        return params

    def _validator(self, key: tuple, schema: dict, cls):
        with self._lock:
            v = self._validators.get(key)
            if v is None:
                # refs in the schema are '#/components/...': make them resolve against a root that has them
                root = {"allOf": [schema], "components": self.spec["components"]}
                if cls is _WriteValidator:
                    v = cls(root, format_checker=oas30_format_checker)
                else:
                    v = cls(root)
                self._validators[key] = v
            return v

    # -- validation ------------------------------------------------------------------------------
    def validate_request(
        self, match: Match, query: dict[str, list[str]], body: object, has_body: bool, content_type: str | None
    ) -> list[str]:
        """Every way this request departs from the description (empty when valid)."""
        op = match.operation
        errors: list[str] = []
        params = self.parameters(op)
        known_query = set()
        for p in params:
            name, where, schema = p["name"], p["in"], self.resolve(p.get("schema", {}))
            if where == "path":
                value = match.path_params.get(name)
                if value is None:
                    errors.append(f"path parameter {name!r} missing")
                    continue
                errors += [
                    f"path parameter {name}: {e}"
                    for e in self._check_value((op.template, op.method, "path", name), schema, value)
                ]
            elif where == "query":
                known_query.add(name)
                if name not in query:
                    if p.get("required"):
                        errors.append(f"required query parameter {name!r} missing")
                    continue
                values = query[name]
                if len(values) > 1 and schema.get("type") != "array":
                    errors.append(f"query parameter {name!r} given {len(values)} times")
                for value in values:
                    errors += [
                        f"query parameter {name}: {e}"
                        for e in self._check_value((op.template, op.method, "query", name), schema, value)
                    ]
        for name in query:
            if name not in known_query:
                errors.append(f"query parameter {name!r} is not in the description of {op.method} {op.template}")

        rb = self.resolve(op.spec["requestBody"]) if "requestBody" in op.spec else None
        if rb is None:
            if has_body and body not in (None, {}, ""):
                errors.append(f"{op.method} {op.template} takes no request body")
            return errors
        if not has_body:
            if rb.get("required"):
                errors.append("request body required")
            return errors
        media = rb.get("content", {})
        if "application/json" not in media:
            return errors + [f"request body of media type {sorted(media)} not supported by the stand-in"]
        if content_type is None or not content_type.split(";")[0].strip().endswith("json"):
            errors.append(f"request body sent as {content_type!r}, not application/json")
        if body is _INVALID_JSON:
            return errors + ["request body is not valid JSON"]
        schema = media["application/json"].get("schema", {})
        v = self._validator((op.template, op.method, "body"), schema, _WriteValidator)
        for e in sorted(v.iter_errors(body), key=lambda e: list(e.absolute_path)):
            where = "/".join(str(p) for p in e.absolute_path) or "(body)"
            errors.append(f"body {where}: {_describe(e)}")
        return errors

    def validate_response(self, match: Match, status: int, body: object) -> list[str]:
        """Every way a response the stand-in made departs from the description."""
        op = match.operation
        responses = op.spec.get("responses", {})
        r = responses.get(str(status))
        if r is None:
            if 200 <= status < 300:
                return [f"status {status} is not a documented response of {op.method} {op.template}"]
            return []  # error statuses GitHub may answer with whether documented or not
        r = self.resolve(r)
        content = r.get("content", {})
        if "application/json" not in content:
            if body not in (None, b"", ""):
                return [f"{op.method} {op.template} {status} has no documented body"]
            return []
        schema = content["application/json"].get("schema", {})
        v = self._validator((op.template, op.method, status), schema, _ReadValidator)
        return [
            f"response {'/'.join(str(p) for p in e.absolute_path) or '(body)'}: {_describe(e)}"
            for e in v.iter_errors(body)
        ]

    def validate_component(self, name: str, instance: object) -> list[str]:
        """Where INSTANCE departs from components/schemas/NAME (e.g. webhook-pull-request-opened)."""
        v = self._validator(("component", name), {"$ref": f"#/components/schemas/{name}"}, _ReadValidator)
        return [
            f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {_describe(e)}" for e in v.iter_errors(instance)
        ]

    def _check_value(self, key: tuple, schema: dict, raw: str) -> list[str]:
        value = _coerce(raw, schema)
        if value is _INVALID_JSON:
            return [f"{raw!r} is not a valid {schema.get('type')}"]
        v = self._validator(key, schema, _WriteValidator)
        return [_describe(e) for e in v.iter_errors(value)]


class _Invalid:
    def __repr__(self):
        return "<invalid>"


_INVALID_JSON = _Invalid()
INVALID_JSON = _INVALID_JSON


def _coerce(raw: str, schema: dict):
    t = schema.get("type")
    if t == "integer":
        try:
            return int(raw)
        except ValueError:
            return _INVALID_JSON
    if t == "number":
        try:
            return float(raw)
        except ValueError:
            return _INVALID_JSON
    if t == "boolean":
        return {"true": True, "false": False}.get(raw, _INVALID_JSON)
    if t == "array":
        return raw.split(",")
    return raw


def _describe(e, limit: int = 300) -> str:
    """A validation error in one line; long instances are named by the rule they break, not quoted."""
    if len(e.message) <= limit:
        return e.message
    return f"breaks {e.validator!r}: {e.validator_value!r}"[:limit]
