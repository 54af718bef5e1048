"""The search space of `tune`: keyword values from a `tune:` section, the configs of a
`@triton.autotune` kernel (discovered in a worker: the gate process never imports user code), or
the product of both. Plain data out: the current config and the candidates.
"""

from __future__ import annotations

import ast
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

from kernalin_ci.entry import parse_entry
from kernalin_ci.errors import UsageError
from kernalin_ci.isolate import run_task
from kernalin_ci.jobs import DiscoverJob

MAX_CANDIDATES = 64


@dataclass
class TuneSpec:
    """What to tune: `params` (entry keyword -> candidate values) and/or an autotuned kernel."""

    params: dict = field(default_factory=dict)
    autotune: str | None = None  # the autotuned kernel's name; None: the only one the entry reaches
    use_autotune: bool = True  # False: ignore autotune configs (only `params`)

    @classmethod
    def from_config(cls, raw: dict | None) -> TuneSpec:
        raw = raw or {}
        return cls(dict(raw.get("params") or {}), raw.get("autotune"), raw.get("autotune", True) is not False)


@dataclass
class Candidate:
    name: str  # "c0", "c1", ... ("current" for the entry as it is)
    params: dict  # keyword values passed to the entry
    autotune: dict | None = None  # {"kernel", "index", "config"}: the pinned autotune config

    @property
    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.params.items()]
        if self.autotune is not None:
            c = self.autotune["config"]
            parts += [f"{k}={v}" for k, v in c["kwargs"].items()]
            parts += [f"{k}={c[k]}" for k in ("num_warps", "num_stages", "num_ctas", "maxnreg") if k in c]
        return " ".join(parts) or "(entry as it is)"

    def to_json(self) -> dict:
        return {"name": self.name, "label": self.label, "params": self.params, "autotune": self.autotune}


@dataclass
class Space:
    current: Candidate
    candidates: list[Candidate]
    defaults: dict  # the entry's current keyword defaults for the tuned params
    autotuned: dict | None = None  # {"kernel", "file", "line", "key", "configs"} of the tuned kernel
    entry_file: str | None = None  # the entry's file relative to the root (None for module entries)
    def_line: int | None = None


def parse_space_args(items: list[str] | None) -> dict:
    """--space NAME=V1,V2,... (repeatable) -> {NAME: [values]}; values are ints, floats or strings."""
    out: dict = {}
    for item in items or []:
        key, sep, vals = item.partition("=")
        if not sep or not key.isidentifier() or not vals.strip():
            raise UsageError(f"--space {item!r}: expected NAME=V1,V2,... (NAME an entry keyword)")
        out[key] = [_value(v.strip()) for v in vals.split(",") if v.strip()]
    return out


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def entry_file(entry: str, root: str) -> Path | None:
    es = parse_entry(entry)
    if es.is_file:
        return es.file_path(Path(root))
    p = Path(root, *es.target.split("."))
    for cand in (p.with_suffix(".py"), p / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def entry_defaults(entry: str, root: str) -> tuple[dict, int | None, Path | None]:
    """The entry's keyword parameters with literal defaults, read from its source (never imported).
    -> ({name: default}, line of the def, file)."""
    path = entry_file(entry, root)
    if path is None or not path.is_file():
        return {}, None, path
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError as e:
        raise UsageError(f"{path}: not valid Python: {e.msg} (line {e.lineno})") from None
    fn_name = parse_entry(entry).function
    fn = next(
        (n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == fn_name), None
    )
    if fn is None:
        return {}, None, path
    a = fn.args
    pos = a.posonlyargs + a.args
    out: dict = {}
    for arg, default in zip(pos[len(pos) - len(a.defaults) :], a.defaults):
        out[arg.arg] = _literal(default)
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        if default is not None:
            out[arg.arg] = _literal(default)
    return out, fn.lineno, path


_NOT_LITERAL = object()


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _NOT_LITERAL


def discover_autotune(entry: str, root: str, device: str, timeout_s: float) -> list[dict]:
    """The autotuned kernels the entry reaches (run in a worker child)."""

    out: list = []

    def on_event(ev):
        if ev.get("event") == "autotune":
            out.extend(ev["kernels"])

    outcome = run_task(
        DiscoverJob(entry=entry, root=root),
        device,
        timeout_s,
        on_event,
    )
    if outcome.status == "usage-error":
        raise UsageError(outcome.detail)
    if outcome.status != "ok":
        tail = " ".join(outcome.output_tail.split()[-30:])[-300:]
        raise UsageError(
            f"loading {entry} to find its autotune configs: {outcome.status} ({outcome.detail}) {tail}".strip()
        )
    return out


def build_space(
    spec: TuneSpec, entry: str, root: str, device: str, timeout_s: float = 120.0, discovered: list[dict] | None = None
) -> Space:
    """Validate the spec against the entry and enumerate the candidates (the current config excluded)."""
    defaults, line, path = entry_defaults(entry, root)
    rel = None
    if path is not None:
        try:
            rel = str(path.resolve().relative_to(Path(root).resolve()))
        except ValueError:
            rel = str(path)
    for name, values in spec.params.items():
        if not isinstance(values, list) or not values:
            raise UsageError(f"tune.params.{name}: expected a non-empty list of candidate values")
        if name not in defaults:
            raise UsageError(
                f"tune.params.{name}: the entry {entry} has no keyword parameter {name!r} with a "
                f"default (the default is the current value; docs/tune.md)"
            )
        if defaults[name] is _NOT_LITERAL:
            raise UsageError(f"tune.params.{name}: the default of {name!r} in {entry} is not a literal value")
    current_params = {k: defaults[k] for k in spec.params}
    tuned = None
    if spec.use_autotune:
        kernels = discovered if discovered is not None else discover_autotune(entry, root, device, timeout_s)
        if spec.autotune is not None:
            tuned = next((k for k in kernels if k["kernel"] == spec.autotune), None)
            if tuned is None:
                names = ", ".join(k["kernel"] for k in kernels) or "none"
                raise UsageError(
                    f"tune.autotune: no autotuned kernel {spec.autotune!r} reached from {entry} (found: {names})"
                )
        elif len(kernels) > 1:
            raise UsageError(
                f"{entry} reaches {len(kernels)} autotuned kernels "
                f"({', '.join(k['kernel'] for k in kernels)}): name one with tune.autotune"
            )
        elif kernels:
            tuned = kernels[0]
    if not spec.params and tuned is None:
        raise UsageError(
            f"nothing to tune in {entry}: no `tune.params` (or --space) and no @triton.autotune "
            f"kernel reached from the entry"
        )
    pinned: list = [None]
    if tuned is not None:
        pinned = [{"kernel": tuned["kernel"], "index": i, "config": c} for i, c in enumerate(tuned["configs"])]
    names = list(spec.params)
    combos = list(itertools.product(*(spec.params[n] for n in names))) or [()]
    cands = []
    for values in combos:
        for at in pinned:
            params = dict(zip(names, values))
            if at is None and params == current_params:
                continue  # the current config races as "current"
            cands.append(Candidate(f"c{len(cands)}", params, at))
    if len(cands) > MAX_CANDIDATES:
        raise UsageError(f"the search space has {len(cands)} candidates (at most {MAX_CANDIDATES}): narrow tune.params")
    if not cands:
        raise UsageError("the search space holds only the current config")
    return Space(Candidate("current", current_params, None), cands, current_params, tuned, rel, line)


def candidate_source(entry: str, root: str, cand: Candidate) -> str:
    """The Python file a candidate entry lives in (written to a temporary directory): it loads the
    user's entry through kernalin_ci.tune.pin in the worker. Values travel as JSON text."""
    args = json.dumps({"entry": entry, "root": root, "params": cand.params, "autotune": cand.autotune})
    return (
        "# written by kernalin-ci tune: candidate " + cand.name + " (" + cand.label.replace("\n", " ") + ")\n"
        "import json as _json\n"
        "from kernalin_ci.tune.pin import load_candidate as _load\n"
        f"entry = _load(**_json.loads({args!r}))\n"
    )
