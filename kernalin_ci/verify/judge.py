"""Judge one case in the parent, from the raw result the worker handed back (verify/exchange.py).

The parent never imports the PR's code. It builds the case's inputs again from the same seed
(op.inputs on the CPU, canary poison included), and runs every check itself: the canary guards
around each input (out-of-bounds writes), the inputs the contract does not let the entry write, and
the op's output check (the float64 reference with its tolerance, poison and non-finite rows, bug
fingerprints and properties; or the exact whole-buffer diff of kv_append). The worker only says what
the kernel produced; it cannot say whether that is right.
"""

from __future__ import annotations

from kernalin_ci.device import DEVICES
from kernalin_ci.domain import alternatives, case_params, key, shape_of, shape_text, with_shape
from kernalin_ci.findings import CaseErrors, Finding, Notice
from kernalin_ci.lazy import torch
from kernalin_ci.ops.base import Case, Expected, Op
from kernalin_ci.runtime.interp_patches import lazy_zeros
from kernalin_ci.runtime.poison import bits, fill_canary, is_canary
from kernalin_ci.verify import exchange
from kernalin_ci.verify.exchange import GUARD, BadResult, worker_text
from kernalin_ci.verify.loop_judge import LoopReader, op_loop_judge
from kernalin_ci.verify.precision import TF32_TOLERANCE, tf32_notice
from kernalin_ci.verify.reference import NotATensor, check_reference, max_errors
from kernalin_ci.verify.supervisor import CaseResult


def judge(
    op: Op, case: Case, params: dict, device: str, raw: dict, memo: dict, poison: bool = True, root: str | None = None
) -> tuple[list[Finding], list[Notice], CaseErrors | None]:
    """Findings, notices and the outputs' measured errors (None: none compared) for one case that ran (at
    `case`, with its `params`). BadResult when the raw result is not one of that case: missing or extra
    tensors, wrong shapes or dtypes."""
    writable = set(op.written_names(params))
    lazy = writable if "huge" in case.tags else set()
    if op.user_code:  # the user's own inputs and reference ran in the worker: their tensors came back
        kw0 = _user_before(raw)
        expected: Expected | None = Expected(
            exchange.tensors(raw, "expected"),
            row_slack=exchange.tensors(raw, "row_slack"),
            tolerance=_tolerance(raw.get("tolerance")),
        )
        lazy = set()
    else:
        kw0 = op.inputs(case, params, "cpu", poison)
        expected = None
    before = exchange.snapshot(kw0, skip=lazy)
    kw = _after_call(raw, kw0, before, lazy)
    guards = _guards(raw, kw0, lazy, poison)
    findings = _guard_findings(op, guards, before)
    for name, old in before.items():
        if name in writable or not isinstance(old, torch.Tensor):
            continue
        changed = bits(kw[name]) != bits(old)
        if bool(changed.any()):
            findings.append(
                Finding(
                    "inputs-unchanged",
                    "input-modified",
                    f"{name}: {int(changed.sum())} of {old.numel()} elements changed by the call "
                    f"(the contract does not let the entry write it)",
                )
            )
    if raw.get("outputs_error") is not None:
        return findings + [Finding("output-shape", "wrong-output", str(raw["outputs_error"])[:400])], [], None
    outs = _outputs(raw, kw)
    notices: list[Notice] = []
    if op.exact:
        findings += op.check(case, before, kw, outs, params)
        return findings, notices, None
    tf32 = tf32_notice(raw.get("ttir"), device, case.dtype, root)
    if tf32 is not None:
        notices.append(tf32)
    expected = expected if expected is not None else op.reference(before, params)
    findings += check_reference(op, case, before, outs, params, memo, TF32_TOLERANCE if tf32 else None, expected)
    findings += op.properties(case, before, outs, params)
    return findings, notices, max_errors(expected, outs)


def _guard_findings(op: Op, guards: dict, before: dict) -> list[Finding]:
    found = []
    for name, (head, tail) in guards.items():
        for side, part in (("before", head), ("after", tail)):
            hit = ~is_canary(part) if part.dtype.is_floating_point else part != fill_canary(part.clone())
            if bool(hit.any()):
                n = int(hit.sum())
                cls = op.guard_class(name, side, before) or "stray-write"
                found.append(
                    Finding(
                        "out-of-bounds-write", cls, f"{n} elements written just {side} {name!r} (outside the tensor)"
                    )
                )
    return found


def _after_call(raw: dict, kw0: dict, before: dict, lazy: set) -> dict:
    """The inputs as the call left them: every tensor input must come back, with its shape and dtype."""
    inputs = exchange.tensors(raw, "inputs")
    sparse = raw.get("sparse") or {}
    names = {k for k, v in kw0.items() if isinstance(v, torch.Tensor)}
    want_sparse = names & lazy
    if set(inputs) != names - want_sparse or not isinstance(sparse, dict) or set(sparse) != want_sparse:
        got = sorted(set(inputs) | (set(sparse) if isinstance(sparse, dict) else set()))
        raise BadResult(f"inputs handed back: {got}, expected {sorted(names)}")
    kw = dict(before)
    for k, t in inputs.items():
        exchange.like(f"input {k}", t, kw0[k])
        kw[k] = t
    for k, s in sparse.items():
        kw[k] = _dense(k, s, kw0[k])
    return kw


def _dense(name: str, s, like) -> torch.Tensor:
    """A huge input from its non-zero rows, zeros elsewhere (never resident as a whole)."""

    if not isinstance(s, dict) or list(s.get("shape", ())) != list(like.shape):
        raise BadResult(f"input {name}: the sparse form has another shape")
    index, rows = s.get("index"), s.get("rows")
    if (
        not isinstance(index, torch.Tensor)
        or not isinstance(rows, torch.Tensor)
        or index.dtype != torch.int64
        or index.dim() != 1
        or tuple(rows.shape) != (index.numel(), *like.shape[1:])
        or rows.dtype != like.dtype
        or (index.numel() and (int(index.min()) < 0 or int(index.max()) >= like.shape[0]))
    ):
        raise BadResult(f"input {name}: malformed sparse rows")
    t = lazy_zeros(tuple(like.shape), like.dtype)
    t[index] = rows
    return t


def _guards(raw: dict, kw0: dict, lazy: set, poison: bool) -> dict:
    """The canary guards of every contiguous input (when poisoned), each GUARD elements of its dtype."""
    got = raw.get("guards") or {}
    want = {k for k, v in kw0.items() if poison and isinstance(v, torch.Tensor) and k not in lazy and v.is_contiguous()}
    if not isinstance(got, dict) or set(got) != want:
        raise BadResult(
            f"guards handed back for {sorted(got) if isinstance(got, dict) else '?'}, expected {sorted(want)}"
        )
    out = {}
    for k, parts in got.items():
        if (
            not isinstance(parts, (list, tuple))
            or len(parts) != 2
            or not all(
                isinstance(p, torch.Tensor) and tuple(p.shape) == (GUARD,) and p.dtype == kw0[k].dtype for p in parts
            )
        ):
            raise BadResult(f"guards of {k}: expected two runs of {GUARD} {kw0[k].dtype} elements")
        out[k] = tuple(parts)
    return out


def _outputs(raw: dict, kw: dict) -> dict:
    outs: dict = dict(exchange.tensors(raw, "outputs"))
    for name, src in exchange.strings(raw, "output_aliases").items():
        if name in outs or not isinstance(kw.get(src), torch.Tensor):
            raise BadResult(f"output {name}: an alias of {src!r}, which is no tensor input")
        outs[name] = kw[src]
    for name, type_name in exchange.strings(raw, "output_types").items():
        if name in outs:
            raise BadResult(f"output {name} handed back twice")
        outs[name] = NotATensor(type_name[:80])
    return outs


def _user_before(raw: dict) -> dict:
    before = raw.get("before")
    if not isinstance(before, dict) or not all(isinstance(k, str) for k in before):
        raise BadResult("before: expected the inputs by name")
    return dict(before)


def _tolerance(v) -> float | None:
    if v is None:
        return None
    if not isinstance(v, float) or not 0 < v < 1:
        raise BadResult("tolerance: expected a number between 0 and 1")
    return v


class CaseReader:
    """Reads the dynamic worker's case-done events of one worker group (a shard): loads each result
    file (or, for a loop case, each step's part: verify/loop_judge.py), judges it, and checks every claim
    the worker makes about a case against what the parent knows. A loop case moved to another shape says
    so in each part, and its steps are judged at that shape. A claim the parent cannot accept is a BadResult:
    - "not checked (interpreter)": only on the CPU;
    - "not checked (unsupported)": only at a shape outside the declared domain, and not at a shape a
      case of this group already ran at (the kernel takes it: its error there is a finding);
    - a case moved to another shape: only to one of `domain.alternatives`, as the worker says."""

    def __init__(self, op: Op, params: dict, domain, main_dtype: str, device: str, poison: bool, root: str | None):
        self.op, self.params, self.domain, self.main_dtype = op, params, domain, main_dtype
        self.device, self.poison, self.root = device, poison, root
        self.memo: dict = {}  # case name -> its Expected (stale-result: a repeat compared with its original)
        self.ran_shapes: set[str] = set()
        self.loops: dict = {}  # case index -> its LoopReader (an op that drives a loop: decode_step)
        self.loop_cases: dict = {}  # case index -> the case its parts ran as (moved to another shape, or not)

    def _loop(self, index: int, case: Case):
        """The LoopReader of a case the op runs as a loop of calls (Op.loop), None for one call."""
        if index not in self.loops:
            loop = self.op.loop(case, case_params(self.params, case), self.poison)
            self.loops[index] = (
                LoopReader(op_loop_judge(loop), device=self.device, root=self.root) if loop is not None else None
            )
        return self.loops[index]

    def partial(self, index: int) -> list[Finding]:
        """The findings of a loop case's steps judged so far (the worker died in it)."""
        loop = self.loops.get(index)
        return list(loop.found) if loop is not None else []

    def part(self, index: int, case: Case, ev: dict, results: str) -> None:
        """One step of a loop case (a case-part event), judged as it arrives; at the shape the part says
        it ran at (`ran`: one of the case's alternatives), the same for every part of the case."""
        ran = self._moved(case, ev["ran"]) if ev.get("ran") is not None else case
        if index in self.loop_cases and self.loop_cases[index].to_json() != ran.to_json():
            raise BadResult("the parts of a loop case ran at different shapes")
        self.loop_cases[index] = ran
        loop = self._loop(index, ran)
        if loop is None:
            raise BadResult("a case-part event: this op's cases are one call each")
        loop.part(index, ev, results)

    def __call__(self, index: int, case: Case, ev: dict, results: str) -> CaseResult:

        status = ev.get("status")
        nc = self._note(case, ev.get("not_checked"), status)
        ran = self._ran(case, ev.get("ran"), nc)
        if status in ("ok", "raised", "cuda-error") and nc is not None and ev.get("ran") is None:
            raise BadResult("a case that ran at its own shape, said to be not checked")
        loop = self._loop(index, self.loop_cases.get(index, ran))
        if loop is not None and (status in ("ok", "raised") or loop.step):
            if self.loop_cases.get(index, ran).to_json() != ran.to_json():  # its parts were judged at another
                raise BadResult("a loop case said to have run at another shape than its parts")
            if loop.found or status == "ok":
                found = loop.finish()
                self.ran_shapes.add(key(shape_of(self.op, ran, self.params)))
                return CaseResult(ran, found, loop.notices, nc)
        if status == "ok":
            raw = exchange.load_case(results, index, ev.get("file"))
            try:
                found, notices, errors = judge(
                    self.op, ran, case_params(self.params, ran), self.device, raw, self.memo, self.poison, self.root
                )
            except BadResult:
                raise
            except Exception as e:  # a result the comparison cannot use: the worker's fault, never a pass
                raise BadResult(
                    f"the result cannot be compared ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
                ) from None
            self.ran_shapes.add(key(shape_of(self.op, ran, self.params)))
            return CaseResult(ran, found, notices, nc, errors)
        if status == "raised":
            return CaseResult(
                ran, [Finding("call", "entry-error", f"the entry raised {worker_text(ev.get('error'))}")], [], nc
            )
        if status == "cuda-error":
            return CaseResult(ran, [Finding("call", "cuda-error", worker_text(ev.get("error")))], [], nc)
        if status == "not-run" and nc is not None and ev.get("ran") is None:
            return CaseResult(None, [], [], nc)
        raise BadResult(
            f"a case-done event with status {worker_text(status)[:40]!r}"
            + (" and no reason" if status == "not-run" else "")
        )

    def _note(self, case: Case, nc, status) -> dict | None:

        if nc is None:
            return None
        if (
            not isinstance(nc, dict)
            or nc.get("reason") not in ("interpreter", "unsupported")
            or not isinstance(nc.get("error", ""), str)
        ):
            raise BadResult("a malformed not-checked note")
        shape = shape_of(self.op, case, self.params)
        nc = {k: nc[k] for k in ("shape", "reason", "error", "instead") if nc.get(k) is not None}
        if nc["reason"] == "interpreter":
            if not DEVICES[self.device].interpreted or status != "not-run":
                raise BadResult(f"'not checked (interpreter)' claimed on {self.device} for a case that ran")
            return nc
        if self.domain.declares(tuple(self.op.domain_axes), shape):
            raise BadResult(f"'unsupported' claimed at {shape_text(shape)}, a declared shape")
        if key(shape) in self.ran_shapes:
            raise BadResult(f"'unsupported' claimed at {shape_text(shape)}, where an earlier case ran")
        if nc.get("shape") != shape_text(shape):
            raise BadResult(
                f"'unsupported' claimed for the shape {worker_text(nc.get('shape'))[:60]!r}, "
                f"the case has {shape_text(shape)}"
            )
        return nc

    def _moved(self, case: Case, moved) -> Case:
        """A case moved to one of its alternative shapes (BadResult for any other)."""
        for alt in alternatives(self.op, case, self.params, self.domain, self.main_dtype):
            c = with_shape(case, alt, self.params)
            if c.to_json() == moved:
                return c
        raise BadResult("a case moved to a shape that is not one of its alternatives")

    def _ran(self, case: Case, moved, nc: dict | None) -> Case:
        """The case as it ran: as planned, or moved to one of its alternative shapes."""
        if moved is None:
            if nc is not None and nc.get("instead"):
                raise BadResult("a case said to run at another shape, with no such case")
            return case
        if nc is None or nc["reason"] != "unsupported":
            raise BadResult("a case moved to another shape without its own being unsupported")
        shape = shape_of(self.op, case, self.params)
        for alt in alternatives(self.op, case, self.params, self.domain, self.main_dtype):
            c = with_shape(case, alt, self.params)
            if c.to_json() == moved:
                if nc.get("instead") != shape_text({**shape, **alt}):
                    break
                return c
        raise BadResult("a case moved to a shape that is not one of its alternatives")
