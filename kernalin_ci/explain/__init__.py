"""Every verdict explained (docs/benchmarking.md, docs/report.md): unchanged by construction, % of peak,
why it changed, provenance, correctness after timing.

Modules: code.py (plain functions on compiled code: normalisation, ptxas figures, instruction mix,
occupancy), compiled.py (worker task: capture and compile the launches at the benchmark shapes),
identity.py (base against head), peak.py (GPU table and % of peak), provenance.py (worker task: GPU,
driver, clocks, versions, copy bandwidth), recheck.py (correctness after timing), model.py (the typed
Explanation on the Report, and its report.json object), gate.py (the gate's calls), render.py (markdown and text).
"""

from __future__ import annotations

from kernalin_ci.explain.gate import finish_kernel, plan_kernel, untimed_on_cpu

__all__ = ["plan_kernel", "finish_kernel", "untimed_on_cpu"]
