"""Shared by the catalogue tests: what the pos-0 probe finds in catalogue files, run for real under the Triton
interpreter, every file in one child process (one interpreter start for a whole directory, not one per file).

The child does what `verify --probe pos0` does for one file: the op's probe case, no poison, the parent's
judge (for a loop op, each step judged as the parent does, up to the first finding)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import resolve_params
    from kernalin_ci.verify.dynamic import run_case
    from kernalin_ci.verify.judge import judge
    from kernalin_ci.verify.loop_judge import op_loop_judge
    from kernalin_ci.runtime.interp_patches import fp8_conversions
    fp8_conversions()  # as the worker does: FP8 casts round and saturate as on the GPU
    out = {}
    for op_name, path, raw in json.loads(sys.argv[1]):
        op = get_op(op_name)
        params = resolve_params(op_name, op.params, raw)
        os.environ["KERNALIN_PARAMS"] = json.dumps(params)
        fn = load_entry(path + ":entry")
        case = op.probe(params, None)
        loop = op.loop(case, params, False)
        if loop is not None:  # a loop of calls (decode_step): each step judged as the parent does
            loop_judge = op_loop_judge(loop)
            found = []
            def hand_back(step, raw, seconds):
                if not found:
                    found.extend(loop_judge.step(step, {k: (v.clone() if hasattr(v, "clone") else v)
                                                  for k, v in raw.items()}))
            run_case(op, fn, case, params, "cpu", poison=False, hand_back=hand_back)
        else:
            found, _, _ = judge(op, case, params, "cpu", run_case(op, fn, case, params, "cpu", poison=False), {},
                                poison=False)
        out[path] = sorted({f.bug_class for f in found})
    print(json.dumps(out))
""")


def probe_classes(files: list[tuple[str, Path, dict]], timeout: int = 900) -> dict[Path, list[str]]:
    """(op, catalogue file, its CATALOGUE params) -> the bug classes the pos-0 probe finds in each file."""
    job = [(op, str(p.relative_to(REPO)), params) for op, p, params in files]
    env = dict(os.environ, TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="1")
    r = subprocess.run(
        [sys.executable, "-c", PROBE_SCRIPT, json.dumps(job)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    found = json.loads(r.stdout.strip().splitlines()[-1])
    return {p: found[str(p.relative_to(REPO))] for _, p, _ in files}
