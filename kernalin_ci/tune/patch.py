"""`--write`: the chosen config as a patch to the entry's source, a unified diff a user can review.

What is edited (docs/tune.md):
- tuned keyword params: their defaults in the entry's `def` (the default *is* the current config);
- a tuned `@triton.autotune` kernel: its `configs` list (a literal list in the decorator, or a
  module-level name bound to a list) becomes the verified configs that won or tied a shape, so the
  autotuner keeps choosing per shape, but only among verified configs.
The source is read and edited as text at the positions `ast` gives; it is never imported.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from pathlib import Path

from kernalin_ci.entry import parse_entry
from kernalin_ci.report.text import not_written_text


@dataclass
class Patch:
    path: str  # relative to the root
    old: str
    new: str

    @property
    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.old.splitlines(True), self.new.splitlines(True), f"a/{self.path}", f"b/{self.path}"
            )
        )


class NotWritable(Exception):
    """The source does not have the shape the writer edits (the reason is the message)."""


def _replace(text: str, edits: list[tuple[ast.AST, str]]) -> str:
    """Replace each node's source segment by its text (positions from ast; later edits first)."""
    lines = text.splitlines(True)
    spans = []
    for node, new in edits:
        start = _char_offset(lines, node.lineno, node.col_offset)
        end = _char_offset(lines, node.end_lineno, node.end_col_offset)
        spans.append((start, end, new))
    for start, end, new in sorted(spans, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _char_offset(lines: list[str], line: int, byte_col: int) -> int:
    """ast columns are UTF-8 byte offsets: convert to a character offset into the text."""
    return sum(len(x) for x in lines[: line - 1]) + len(lines[line - 1].encode()[:byte_col].decode(errors="ignore"))


def _function(tree: ast.Module, name: str):
    return next(
        (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None
    )


def write_params(text: str, function: str, values: dict) -> str:
    """Set the defaults of keyword parameters of `function` to `values` (literals)."""
    tree = ast.parse(text)
    fn = _function(tree, function)
    if fn is None:
        raise NotWritable(f"no function {function!r}")
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = {arg.arg: d for arg, d in zip(pos[len(pos) - len(a.defaults) :], a.defaults)}
    defaults.update({arg.arg: d for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    edits = []
    for k, v in values.items():
        if k not in defaults:
            raise NotWritable(f"{function} has no keyword parameter {k!r} with a default")
        edits.append((defaults[k], repr(v)))
    return _replace(text, edits)


def config_text(prefix: str, c: dict) -> str:
    kw = ", ".join(f"{k!r}: {v!r}" for k, v in c["kwargs"].items())
    rest = "".join(f", {k}={c[k]!r}" for k in ("num_warps", "num_stages", "num_ctas", "maxnreg") if k in c)
    return f"{prefix}Config({{{kw}}}{rest})"


def write_autotune(text: str, kernel: str, configs: list[dict]) -> str:
    """Replace the configs list of the @autotune decorator of `kernel` by `configs`."""
    if any(c.get("pre_hook") for c in configs):
        raise NotWritable("a config has a pre_hook (not expressible as text)")
    tree = ast.parse(text)
    fn = _function(tree, kernel)
    if fn is None:
        raise NotWritable(f"no function {kernel!r}")
    call = next(
        (d for d in fn.decorator_list if isinstance(d, ast.Call) and ast.unparse(d.func).split(".")[-1] == "autotune"),
        None,
    )
    if call is None:
        raise NotWritable(f"{kernel} has no @autotune(...) decorator")
    node = next((k.value for k in call.keywords if k.arg == "configs"), call.args[0] if call.args else None)
    if isinstance(node, ast.Name):
        assign = next(
            (
                n
                for n in tree.body
                if isinstance(n, ast.Assign)
                and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Name)
                and n.targets[0].id == node.id
            ),
            None,
        )
        if assign is None:
            raise NotWritable(f"configs={node.id}: no module-level assignment of {node.id}")
        node = assign.value
    if not isinstance(node, (ast.List, ast.ListComp, ast.Tuple)):
        raise NotWritable("the configs are neither a list nor a name bound to a list")
    prefix = ast.unparse(call.func)[: -len("autotune")]
    line = text.splitlines()[node.lineno - 1]
    indent = line[: len(line) - len(line.lstrip())]
    body = "".join(f"{indent}    {config_text(prefix, c)},\n" for c in configs)
    new = "[  # kernalin-ci tune: the verified configs that won or tied a shape\n" + body + indent + "]"
    return _replace(text, [(node, new)])


def make_patch(result) -> tuple[Patch | None, str]:
    """-> (patch, why): the patch for the chosen config, or None and the reason nothing is written."""
    space = result.space
    root = Path(result.target.root).resolve()
    if space.entry_file is None:
        return None, "the entry is not a file in the repository"
    path = root / space.entry_file

    function = parse_entry(result.target.entry).function
    text = path.read_text()
    new = text
    try:
        if space.autotuned is not None:
            names = []
            for j in result.judgements:
                for n in [j.best, *j.equivalent]:
                    if n != "current" and n not in names:
                        names.append(n)
            if not names and result.chosen not in (None, "current"):
                names = [result.chosen]
            cands = {c.name: c for c in space.candidates}
            configs = []
            for n in names:
                cfg = cands[n].autotune["config"]
                if cfg not in configs:
                    configs.append(cfg)
            if not configs:
                return None, "no verified config won a shape"
            if len(configs) == len(space.autotuned["configs"]):
                return None, "every autotune config is verified and in the race's top group: nothing to change"
            if space.autotuned["file"] != space.entry_file:
                path = root / space.autotuned["file"]
                text = new = path.read_text()
            new = write_autotune(new, space.autotuned["kernel"], configs)
            params = cands[names[0]].params if space.current.params else {}
        else:
            params = _params_to_write(result)
            if isinstance(params, str):
                return None, params
        if params:
            entry_path = root / space.entry_file
            if entry_path != path:
                return None, "the tuned params and the autotuned kernel live in different files"
            new = write_params(new, function, params)
    except NotWritable as e:
        return None, f"not written: {e}"
    except SyntaxError as e:
        return None, f"not written: the source does not parse ({e.msg})"
    if new == text:
        return None, "the source already holds the chosen config"
    return Patch(str(path.relative_to(root)), text, new), ""


def _params_to_write(result) -> dict | str:
    chosen = result.chosen
    if chosen is None:
        return "no config was chosen"
    if chosen == "current":
        return "the current config is the best (or equivalent to the best) on the shapes"
    cand = next(c for c in result.space.candidates if c.name == chosen)
    if result.reference == "current":
        verdicts = [j.vs_reference[chosen].verdict for j in result.judgements if chosen in j.vs_reference]
        why = not_written_text(cand.label, verdicts)
        if why is not None:
            return why
    return dict(cand.params)


def apply(patch: Patch, root: str) -> None:
    Path(root, patch.path).write_text(patch.new)
