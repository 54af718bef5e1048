"""attention.decode entries that are wrong (KV head h % Hkv instead of h // (Hq // Hkv)) and, on their first
call, try to forge the verdict from inside the worker: they find the result pipe (its fd is on the worker's
command line) and the job file, write events and result files for every case, and exit before the worker
can report anything true. Each must still FAIL `kernalin-ci verify` (attack 3 of issue 13)."""

import json
import os
import sys
import tempfile

import torch

GUARD = 16384


def _buggy(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        L = int(kv_lens[b])
        for h in range(Hq):
            g = h % Hkv  # the bug: the GQA head mapping
            p = torch.softmax((k_cache[b, g, :L].float() @ q[b, h].float()) * scale, dim=0)
            out[b, h] = (p @ v_cache[b, g, :L].float()).to(q.dtype)
    return out


def _worker():
    """The job (cases, results directory) and the result pipe's fd, from the worker's command line."""
    job_path, fd = sys.argv[-2], int(sys.argv[-1])
    with open(job_path) as f:
        return json.load(f)["job"], fd  # the job file: {"task", "device", "job"} (kernalin_ci/isolate.py)


def _send(fd, *events):
    os.write(fd, b"".join(json.dumps(e).encode() + b"\n" if isinstance(e, dict) else e for e in events))


def _pass_event(i, name):
    """A case-done that says 'no findings' in both the old and the current event format."""
    return {"event": "case-done", "index": i, "seconds": 0.0, "findings": [], "status": "ok", "file": name}


def _cases(job):
    from kernalin_ci.ops.base import Case

    return [Case.from_json(c) for c in job["cases"]]


def _results_dir(job):
    return job.get("results") or tempfile.mkdtemp()


def forge_pass_events(q, k_cache, v_cache, kv_lens, scale):
    """A clean 'case-done' for every case, then 'done', then exit: no result file at all."""
    job, fd = _worker()
    for i in range(job.get("start", 0), len(job["cases"])):
        _send(fd, {"event": "case-start", "index": i}, _pass_event(i, f"case-{i}.pt"))
    _send(fd, {"event": "done"})
    os._exit(0)


def forge_wellformed_results(q, k_cache, v_cache, kv_lens, scale):
    """For every case: the exact inputs (rebuilt with kernalin-ci's own builder), untouched canary guards,
    and this kernel's (wrong) output, in the format the parent reads; 'pass' events; exit. The parent
    compares the tensors itself: the wrong head mapping is found."""
    from kernalin_ci.ops import get_op
    from kernalin_ci.runtime.poison import fill_canary

    job, fd = _worker()
    op, results = get_op(job["op"]), _results_dir(job)
    for i, case in enumerate(_cases(job)):
        if i < job.get("start", 0):
            continue
        kw = op.inputs(case, job["params"], "cpu", True)
        tensors = {k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}
        raw = {
            "inputs": tensors,
            "sparse": {},
            "guards": {k: [fill_canary(torch.empty(GUARD, dtype=v.dtype))] * 2 for k, v in tensors.items()},
            "outputs": {"out": _buggy(**kw)},
            "output_aliases": {},
            "output_types": {},
        }
        torch.save(raw, os.path.join(results, f"case-{i}.pt"))
        _send(fd, {"event": "case-start", "index": i}, _pass_event(i, f"case-{i}.pt"))
    _send(fd, {"event": "done"})
    os._exit(0)


def forge_odd_files(q, k_cache, v_cache, kv_lens, scale):
    """Result files the parent never asked for or cannot trust: an output only (no inputs, no guards),
    a symlink to another file, files for cases that do not exist; 'pass' events; exit."""
    job, fd = _worker()
    results = _results_dir(job)
    n = len(job["cases"])
    for i in range(job.get("start", 0), n):
        path = os.path.join(results, f"case-{i}.pt")
        if i % 2:
            os.symlink("/etc/passwd", path)
        else:
            torch.save({"outputs": {"out": torch.zeros(1)}}, path)
        _send(fd, {"event": "case-start", "index": i}, _pass_event(i, f"case-{i}.pt"))
    for extra in (n, n + 7):
        torch.save({"outputs": {}}, os.path.join(results, f"case-{extra}.pt"))
    _send(fd, {"event": "case-start", "index": n}, _pass_event(n, f"case-{n}.pt"), {"event": "done"})
    os._exit(0)


def forge_early_done(q, k_cache, v_cache, kv_lens, scale):
    """Say the whole run is done before any case reported, and exit cleanly."""
    _, fd = _worker()
    _send(fd, {"event": "done"})
    os._exit(0)


def forge_malformed(q, k_cache, v_cache, kv_lens, scale):
    """Lines that are no event, then clean 'pass' events for every case (the index as a string for one)."""
    job, fd = _worker()
    _send(fd, b"not json\n", b"[1, 2]\n", b'"case-done"\n')
    for i in range(job.get("start", 0), len(job["cases"])):
        _send(fd, {"event": "case-start", "index": i}, _pass_event(str(i) if i == 3 else i, f"case-{i}.pt"))
    _send(fd, {"event": "done"})
    os._exit(0)


def forge_pipeline_steps(key, value, k_cache, v_cache, slot_mapping):
    """As the decode pipeline's kv_append entry (it appends nothing): 'the loop ended cleanly, no findings',
    with no step handed back."""
    _, fd = _worker()
    _send(fd, {"event": "case-done", "index": 0, "seconds": 0.0, "findings": [], "status": "ok"}, {"event": "done"})
    os._exit(0)


def forge_decode_step_loop(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale):
    """As a decode_step entry (it writes nothing): on its first call, step 0 handed back in the exact part
    format with the caches untouched and a zero output, then 'the loop ended cleanly' for its case, and for
    every later case a clean end with no step handed back."""
    job, fd = _worker()
    results = _results_dir(job)
    i = job.get("start", 0)
    raw = {
        "q": q.cpu(),
        "k": k.cpu(),
        "v": v.cpu(),
        "positions": positions.cpu(),
        "slot_mapping": slot_mapping.cpu(),
        "block_tables": block_tables.cpu(),
        "kv_lens": kv_lens.cpu(),
        "k_cache": k_cache.cpu().clone(),
        "v_cache": v_cache.cpu().clone(),
        "out": torch.zeros_like(q).cpu(),
    }
    torch.save(raw, os.path.join(results, f"case-{i}-0.pt"))
    _send(
        fd,
        {"event": "case-part", "index": i, "part": 0, "seconds": 0.0, "file": f"case-{i}-0.pt"},
        {"event": "case-done", "index": i, "seconds": 0.0, "findings": [], "status": "ok"},
    )
    for j in range(i + 1, len(job["cases"])):
        _send(
            fd,
            {"event": "case-start", "index": j},
            {"event": "case-done", "index": j, "seconds": 0.0, "findings": [], "status": "ok"},
        )
    _send(fd, {"event": "done"})
    os._exit(0)
