"""What the dynamic worker hands back per case: raw tensors in a file, nothing judged.

The child (kernalin_ci.verify.dynamic, in the process that runs the PR's code) writes one file per
case into a directory the parent created, `case-<index>.pt` (torch.save of CPU tensors and plain
data), and its `case-done` event only names the case and the file. The parent loads it with
`torch.load(weights_only=True)` (tensors, dicts, lists, strings and numbers only: no pickled
objects, no code), checks that it has the shape the parent expects, and judges it
(kernalin_ci.verify.judge). Anything the parent did not ask for, or cannot read, is a `bad-result`
finding for that case, never a pass.

A raw result (a dict):
  outputs         {name: tensor}: the entry's outputs (op.outputs), moved to the CPU
  output_aliases  {name: input name}: an output that is one of the inputs (a cache written in place)
  output_types    {name: type name}: an output that is not a tensor
  outputs_error   str: op.outputs refused the return value (a wrong return structure)
  inputs          {name: tensor}: every tensor input after the call (written caches, unchanged inputs)
  sparse          {name: {"shape": [...], "index": tensor, "rows": tensor}}: an input too large to
                  ship (the 2^31-element caches): the non-zero rows of its first dimension
  guards          {name: [before, after]}: the canary guards just before and after each input
  ttir            [str]: the TTIR of each compiled kernel the call launched (CUDA: TF32 dots; a
                  decode loop's step part carries its own, verify/loop_drive.py)
  before, expected, row_slack, tolerance: only for an op whose inputs and reference are the
                  user's own code (`Op.user_code`): the inputs before the call and that reference
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any

from kernalin_ci.lazy import torch
from kernalin_ci.runtime.poison import words

GUARD = 16384  # canary elements the child puts before and after every input tensor
MAX_FILE_BYTES = 8 << 30  # a result larger than this is not read
KEYS = frozenset(
    {
        "outputs",
        "output_aliases",
        "output_types",
        "outputs_error",
        "inputs",
        "sparse",
        "guards",
        "ttir",
        "before",
        "expected",
        "row_slack",
        "tolerance",
    }
)


class BadResult(Exception):
    """The worker's result for a case is missing, unreadable or not what was asked for."""


def file_name(index: int) -> str:
    return f"case-{index}.pt"


def part_name(index: int, part: int) -> str:
    """A case handed back in parts (the decode pipeline: one per step)."""
    return f"case-{index}-{part}.pt"


# ------------------------------------------------------------------ both sides


def snapshot(kw: dict, skip: set) -> dict:
    """The inputs before the call: a copy of every tensor, None for those in `skip` (too large)."""
    return {k: (v.clone() if isinstance(v, torch.Tensor) and k not in skip else v) for k, v in kw.items()} | {
        k: None for k in skip
    }


# ------------------------------------------------------------------ child side


def plain(t):
    """A CPU tensor holding just t's elements (a view would carry its whole storage into the file)."""
    t = t.detach().to("cpu")
    if t.storage_offset() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def sparse_rows(t) -> dict:
    """The rows (first dimension) of a huge, mostly zero tensor that hold anything but zeros."""

    found = []
    step = max(1, (1 << 25) // max(1, t[0].numel()))
    for start in range(0, t.shape[0], step):
        nz = (words(t[start : start + step]) != 0).any(1).nonzero().flatten()
        if nz.numel():
            found.append(nz + start)
    index = torch.cat(found).to(torch.int64) if found else torch.zeros(0, dtype=torch.int64, device=t.device)
    return {"shape": list(t.shape), "index": index.cpu(), "rows": plain(t[index])}


def save(directory: str, name: str, raw: dict) -> str:
    """Write a raw result to file `name` (file_name or part_name); returns the name the event gives."""
    torch.save(raw, os.path.join(directory, name))
    return name


def hand_back_parts(
    emit: Callable[[dict[str, Any]], None], results: str, index: int, planned: Any = None
) -> Callable[..., None]:
    """A case handed back in parts (a decode loop, verify/loop_drive.py): each step's raw result as part file
    `case-<index>-<step>.pt` and a `case-part` event naming it. A case run at another shape than `planned`
    (the kernel refused its own: verify/support.py) says so in each part (`ran`: `hand_back.running`, set by
    the caller), so that the parent judges its steps at the shape they ran at."""

    def hand_back(step: int, raw: dict[str, Any], seconds: float, **fields: Any) -> None:
        ran = hand_back.running  # type: ignore[attr-defined]
        ev = {
            "event": "case-part",
            "index": index,
            "part": step,
            "seconds": seconds,
            "file": save(results, part_name(index, step), raw),
            **fields,
        }
        if ran is not None and planned is not None and ran.to_json() != planned.to_json():
            ev["ran"] = ran.to_json()
        emit(ev)

    hand_back.running = planned  # type: ignore[attr-defined]  # the case being run (verify.dynamic.run_case sets it)
    return hand_back


# ------------------------------------------------------------------ parent side


def worker_text(v: object) -> str:
    """A text the worker sent (an error, a reason), as one line of at most 500 characters."""
    return " ".join(str(v).split())[:500]


def load(directory: str, name: str, named, max_bytes: int = MAX_FILE_BYTES) -> dict:
    """The raw result in file `name` (file_name(index) or part_name(index, n)), which the event must
    have named (`named`); BadResult if it is not exactly that file, a regular file (no symlink) of at
    most `max_bytes`, readable as tensors and plain data. The file is removed."""
    if named != name:
        raise BadResult(f"the event names another result file ({str(named)[:80]!r})")
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise BadResult(f"no readable result file ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            raise BadResult(f"the result is not a regular file of at most {max_bytes} bytes")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            try:
                raw = torch.load(f, map_location="cpu", weights_only=True)
            except Exception as e:  # a truncated or forged file: whatever torch says about it
                raise BadResult(
                    f"the result file cannot be read: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
                ) from None
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(path)
    return raw


def load_case(directory: str, index: int, named) -> dict:
    """Case `index`'s raw result (see the module's docstring)."""
    raw = load(directory, file_name(index), named)
    if not isinstance(raw, dict) or not set(raw) <= KEYS:
        extra = sorted(map(str, set(raw) - KEYS)) if isinstance(raw, dict) else type(raw).__name__
        raise BadResult(f"the result file holds no raw result ({extra})")
    return raw


def tensors(raw: dict, key: str) -> dict:
    """raw[key] as {name: tensor} (empty if absent); BadResult if it is anything else."""
    d = raw.get(key) or {}
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in d.items()):
        raise BadResult(f"{key}: expected tensors by name")
    return d


def strings(raw: dict, key: str) -> dict:
    d = raw.get(key) or {}
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in d.items()):
        raise BadResult(f"{key}: expected names")
    return d


def like(name: str, got, want) -> None:
    """`got` must have `want`'s shape and dtype."""
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        raise BadResult(
            f"{name}: {tuple(got.shape)} {got.dtype} handed back, {tuple(want.shape)} {want.dtype} expected"
        )


def leftovers(directory: str) -> list[str]:
    """Files in the results directory that no event named (each is removed)."""
    out = []
    for name in sorted(os.listdir(directory)):
        out.append(name)
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            import shutil

            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    return out
