"""Host-side data movement between an entry's inputs and the tensors its kernels read.

An entry may prepare its inputs on the host before a launch: keep only the tokens with a slot
(`key[slot_mapping >= 0]`), `index_select` rows, make a contiguous or float32 copy. While the capture call
runs, `HostMoves` (a TorchDispatchMode) follows the elements such ops move: every storage an op input lives
in has a map from its elements to that input's element offsets, and an op that only moves or converts
elements (indexing, gather, copy, cast) gets its result's map by running the same op on the maps. Any other
op that writes a storage makes its elements unknown. The capture then knows, element by element, which
input element a kernel's scratch tensor holds (`origin`), and the interpreter reads it as that element.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# ops whose result's elements are elements of their first argument (run on the maps as on the data)
MOVES = {
    aten.index.Tensor,
    aten.index_select.default,
    aten.gather.default,
    aten.masked_select.default,
    aten.take.default,
    aten.clone.default,
    aten._to_copy.default,
    aten.flip.default,
}
# keyword arguments that change the dtype, device or layout of a result, never which elements it holds
_CONVERT = ("dtype", "layout", "device", "pin_memory", "non_blocking", "memory_format")


def _key(t: torch.Tensor) -> tuple[int, int]:
    """A storage: its address and size (a freed storage's address is reused by later allocations)."""
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


class HostMoves(TorchDispatchMode):
    def __init__(self, inputs: dict):
        super().__init__()
        # storage (address, bytes) -> (input name, element size, int64 map over the storage's elements)
        self.maps: dict = {}
        self._paused = False
        for name, t in inputs.items():
            if isinstance(t, torch.Tensor) and t.numel() and _key(t) not in self.maps:
                n = t.untyped_storage().nbytes() // t.element_size()
                self.maps[_key(t)] = (name, t.element_size(), torch.arange(n, dtype=torch.int64) - t.storage_offset())

    @contextlib.contextmanager
    def paused(self):
        self._paused, old = True, self._paused
        try:
            yield
        finally:
            self._paused = old

    def origin(self, t: torch.Tensor):
        """(input name, numpy map: element offset from t's first element -> input element offset, -1 where the
        element is not one of that input's) for a tensor the host filled from an op input, else None."""
        ent = self.maps.get(_key(t))
        if ent is None or ent[1] != t.element_size():
            return None
        name, _, smap = ent
        m = smap[t.storage_offset() :].numpy().copy()
        return (name, m) if (m >= 0).any() else None

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self._paused:
            try:
                self._follow(func, args, kwargs, out)
            except (RuntimeError, TypeError, ValueError, IndexError):
                for t in _written(func, args, out):
                    self._forget(t)
        return out

    def _view(self, t):
        ent = self.maps.get(_key(t)) if isinstance(t, torch.Tensor) else None
        if ent is None or ent[1] != t.element_size():
            return None
        return ent[0], torch.as_strided(ent[2], t.shape, t.stride(), t.storage_offset())

    def _write(self, t: torch.Tensor, name: str, elems: torch.Tensor) -> None:
        ent = self.maps.get(_key(t))
        if ent is None or ent[0] != name or ent[1] != t.element_size():
            n = t.untyped_storage().nbytes() // t.element_size()
            ent = (name, t.element_size(), torch.full((n,), -1, dtype=torch.int64))
            self.maps[_key(t)] = ent
        torch.as_strided(ent[2], t.shape, t.stride(), t.storage_offset()).copy_(elems.expand(t.shape))

    def _forget(self, t: torch.Tensor) -> None:
        """t's elements no longer hold input elements (written by something else)."""
        ent = self.maps.get(_key(t))
        if ent is None:
            return
        if ent[1] != t.element_size():
            del self.maps[_key(t)]
        else:
            torch.as_strided(ent[2], t.shape, t.stride(), t.storage_offset()).fill_(-1)

    def _follow(self, func, args, kwargs, out) -> None:
        if func is aten.copy_.default:
            src = self._view(args[1])
            if src is None:
                self._forget(args[0])
            else:
                self._write(args[0], *src)
            return
        if func in MOVES and isinstance(out, torch.Tensor):
            src = self._view(args[0])
            if src is not None:
                elems = func(src[1], *args[1:], **{k: v for k, v in kwargs.items() if k not in _CONVERT})
                self._write(out, src[0], elems)
                return
        for t in _written(func, args, out):
            self._forget(t)


# torch wraps every TorchDispatchMode's __torch_dispatch__ so that torch.compile leaves it alone; the
# wrapper's first call imports torch._dynamo to build that (2-3 s, the structural worker's longest
# step on the H200). Nothing here is ever compiled: the function is its own dynamo-free form, in the
# attribute where the wrapper keeps it (a torch without the wrapper has no __wrapped__: nothing to do).
_dispatch = getattr(HostMoves.__torch_dispatch__, "__wrapped__", None)
if _dispatch is not None:
    setattr(_dispatch, "__dynamo_disable", _dispatch)


def _written(func, args, out) -> list:
    """The tensors an op writes: its mutated arguments and its results that are not views of an argument."""
    schema = func._schema
    outs = []
    for a, v in zip(schema.arguments, args):
        if a.alias_info is not None and a.alias_info.is_write and isinstance(v, torch.Tensor):
            outs.append(v)
    res = out if isinstance(out, (tuple, list)) else (out,)
    for r, v in zip(schema.returns, res):
        if r.alias_info is None and isinstance(v, torch.Tensor):
            outs.append(v)
    return outs


def identity_origin(info, src_info) -> tuple:
    """The origin of a full copy of an input (same shape, any strides): element offsets -> the input's."""
    n = max((info.storage.size - info.base) // max(info.elsize, 1), 0)
    elems = np.arange(n, dtype=np.int64)
    co = info.coords(elems)
    src = (co * np.array(src_info.strides, dtype=np.int64)).sum(-1)
    return src_info.name, np.where(info.in_bounds(elems), src, -1)
