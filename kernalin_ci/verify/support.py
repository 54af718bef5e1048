"""Which shapes a kernel takes, found in the worker while the case plan runs (docs/verification.md,
"Shape domain").

The rule that tells "unsupported" from "a bug": when the entry raises on a case,
- at a declared shape (every axis of the op declared, the case inside it): an `entry-error` finding;
- at a shape the entry already ran at (another case, or a cheap probe launch of the same shape with
  a short length): an `entry-error` finding, because the kernel takes that shape and fails on this
  case's data (lengths, positions, slots);
- otherwise the shape is outside the kernel's domain: the case is "unsupported, not checked", with
  the kernel's own error, and runs at the nearest shape the kernel takes instead (one axis moved,
  then two), so its lengths and positions are still checked.
A case the CPU interpreter cannot run faithfully (`Interpreter`: bfloat16, a construct it cannot emulate)
is "not checked (interpreter)", whatever it showed.
The worker only reports these outcomes (a `CaseOutcome` per case); the parent turns them into findings and
checks each claim it can (verify/judge.py, CaseReader; verify/loop_judge.py, PipelineReader).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernalin_ci.domain import Domain, alternatives, case_params, key, shape_of, shape_text, with_shape
from kernalin_ci.ops.base import Case
from kernalin_ci.runtime.interp_bf16 import faithful_bf16, take_unfaithful


class EntryRaised(Exception):
    """The entry raised (verify/dynamic.py): an `entry-error` finding, or a shape outside the kernel's domain
    (`Support` decides which to report; the parent checks that claim)."""


PROBE_BUDGET = 12  # new probe launches per refused case while looking for a shape the kernel takes
TOTAL_PROBES = 48  # and per worker: an entry that refuses everything costs a bounded number of launches


@dataclass
class CaseOutcome:
    """What happened to one planned case, in the worker's words (the parent judges it)."""

    result: Any = None  # the raw result of the call (verify/exchange.py), when it returned
    ran: Case | None = None  # the case as it ran (moved to another shape, or as planned); None: not run
    not_checked: dict | None = None  # {"shape", "reason", "error", "instead"}
    moved: bool = False
    error: str | None = None  # the entry raised this where that is its error (an `entry-error` finding)

    def event_fields(self) -> dict:
        out: dict = {}
        if self.moved and self.ran is not None:
            out["ran"] = self.ran.to_json()
        if self.not_checked:
            out["not_checked"] = self.not_checked
        return out


class Support:
    def __init__(
        self,
        op,
        params: dict,
        domain: Domain,
        main_dtype: str,
        launch: Callable[[Case, dict], None],
        unfaithful: Callable[[], str | None] = lambda: None,
    ):
        self.op, self.params, self.domain, self.main_dtype = op, params, domain, main_dtype
        self.launch = launch  # one unchecked call of the entry
        # why the CPU interpreter could not run what was just launched (None: it could); an error then is the
        # interpreter's, not the kernel's: the case is "not checked (interpreter)"
        self.unfaithful = unfaithful
        self.known: dict[str, str | None] = {}  # shape -> None (the entry ran at it) or its error
        self.interpreter: dict[str, str] = {}  # shape -> why the interpreter cannot run it
        self.searches_left = TOTAL_PROBES

    def declared(self, shape: dict) -> bool:
        return self.domain.declares(tuple(self.op.domain_axes), shape)

    def run(self, case: Case, run_case: Callable[[Case, dict], Any]) -> CaseOutcome:
        shape = shape_of(self.op, case, self.params)
        k = key(shape)
        if k in self.interpreter:
            return CaseOutcome(
                None, None, {"shape": shape_text(shape), "reason": "interpreter", "error": self.interpreter[k]}
            )
        if not self.declared(shape) and self.known.get(k) is not None:
            return self._elsewhere(case, shape, self.known[k], run_case)
        try:
            found = self._call(run_case, case)
        except EntryRaised as e:
            why = self.unfaithful()
            if why:
                self.interpreter[k] = why
                return CaseOutcome(None, None, {"shape": shape_text(shape), "reason": "interpreter", "error": why})
            if self.declared(shape) or (k in self.known and self.known[k] is None):
                return CaseOutcome(None, case, error=str(e))
            refused = self.probe(shape)
            if refused is None:  # it takes the shape: the error is this case's
                return CaseOutcome(None, case, error=str(e))
            return self._elsewhere(case, shape, refused, run_case)
        self.known[k] = None
        return CaseOutcome(found, case)

    def probe(self, shape: dict) -> str | None:
        """A cheap launch at this shape (the op's small shape case, no checks): None if it ran."""
        k = key(shape)
        if k not in self.known:
            small = with_shape(self.op.shape_case(self.params, shape.get("dtype", self.main_dtype)), shape, self.params)
            try:
                self._call(lambda c, p: self.launch(c, p), small)
                self.known[k] = None
            except EntryRaised as e:
                self.unfaithful()  # an alternative the interpreter cannot run is refused all the same
                self.known[k] = str(e)
        return self.known[k]

    def _elsewhere(self, case: Case, shape: dict, error: str, run_case) -> CaseOutcome:
        note = {"shape": shape_text(shape), "reason": "unsupported", "error": error}
        fresh = 0
        for alt in alternatives(self.op, case, self.params, self.domain, self.main_dtype):
            target = {**shape, **alt}
            if key(target) not in self.known:
                if fresh >= PROBE_BUDGET or self.searches_left <= 0:
                    break
                fresh += 1
                self.searches_left -= 1
            if self.probe(target) is not None:
                continue
            moved = with_shape(case, alt, self.params)
            note["instead"] = shape_text(target)
            try:
                return CaseOutcome(self._call(run_case, moved), moved, note, moved=True)
            except EntryRaised as e:  # it ran at this shape before: the error is this case's
                return CaseOutcome(None, moved, note, moved=True, error=str(e))
        return CaseOutcome(None, None, note)

    def _call(self, fn, case: Case):
        p = case_params(self.params, case)
        os.environ["KERNALIN_PARAMS"] = json.dumps(p)  # what current_params() gives the entry
        return fn(case, p)


class Interpreter:
    """On the CPU: makes the Triton interpreter compute bfloat16 on values, and says which cases it
    still cannot run faithfully. Those are not checked (never a finding): their case-done event
    carries `not_checked` {"reason": "interpreter", "error": why} (the parent accepts it on the CPU only)."""

    def __init__(self, cpu: bool):
        self.cpu = cpu
        self.bf16 = faithful_bf16() if cpu else None  # None: bfloat16 is faithful (or not on the CPU)
        take_unfaithful()

    def cannot_run(self, dtype: str) -> dict:
        """case-done fields for a case of this dtype that cannot run faithfully at all ({} if it can)."""
        return self._fields(self.bf16 if self.cpu and dtype == "bfloat16" else None)

    def after_case(self) -> dict:
        """case-done fields for the case just run if it used a construct the interpreter cannot emulate."""
        return self._fields(take_unfaithful() if self.cpu else None)

    @staticmethod
    def _fields(why: str | None) -> dict:
        if not why:
            return {}
        return {"not_checked": {"reason": "interpreter", "error": why}}
