"""attention.decode entries that, called by the structural worker's capture (TRITON_INTERPRET=0, no launch),
forge its result: they find the result pipe and the job file on the worker's command line, write a
`structural-done` event (and a material file) of their own, and exit before the worker reports anything
true. The parent analyses only the material it can check, so none of them may PASS (attack 3, structural)."""

import json
import os
import sys

import torch

CLEAN = {
    "event": "structural-done",
    "findings": [],
    "notices": [],
    "kernels": [],
    "seconds": {},
    "status": {"status": "analysed", "cause": None, "shape": "D=48 float16 Hq=6 Hkv=2"},
}


def _worker():
    job_path, fd = sys.argv[-2], int(sys.argv[-1])
    with open(job_path) as f:
        return json.load(f)["job"], fd  # the job file: {"task", "device", "job"} (kernalin_ci/isolate.py)


def _send_and_exit(fd, event):
    os.write(fd, json.dumps(event).encode() + b"\n" + json.dumps({"event": "done"}).encode() + b"\n")
    os._exit(0)


def forge_structural_done(q, k_cache, v_cache, kv_lens, scale):
    """'Analysed, no findings', in the event alone (the old format): no material handed back."""
    _, fd = _worker()
    _send_and_exit(fd, CLEAN)


def forge_oversized_material(q, k_cache, v_cache, kv_lens, scale):
    """A material file larger than the parent reads (sparse: it takes no disk)."""
    job, fd = _worker()
    with open(os.path.join(job["results"], "structural.pt"), "wb") as f:
        f.truncate((1 << 30) + 1)
    _send_and_exit(fd, {**CLEAN, "file": "structural.pt"})


def forge_malformed_material(q, k_cache, v_cache, kv_lens, scale):
    """A readable file of the right name that claims a capture with no tensors and no launches."""
    job, fd = _worker()
    raw = {"shape": 0, "refused": [], "tensors": {}, "launches": [], "outputs": {}, "kwargs": {}, "notes": []}
    torch.save(raw, os.path.join(job["results"], "structural.pt"))
    _send_and_exit(fd, {**CLEAN, "file": "structural.pt"})
