"""attention.decode entries written in plain PyTorch, for testing the engine's mechanics quickly.

`entry` is correct; every other function has one defect the engine must name.
"""
import os
import signal

import torch

_CACHE = {}


def _attend(q, k_cache, v_cache, kv_lens, scale, group_of=None):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        L = int(kv_lens[b])
        for h in range(Hq):
            g = group_of(h, Hq, Hkv) if group_of else h // (Hq // Hkv)
            s = (k_cache[b, g, :L].float() @ q[b, h].float()) * scale
            p = torch.softmax(s, dim=0)
            out[b, h] = (p @ v_cache[b, g, :L].float()).to(q.dtype)
    return out


def entry(q, k_cache, v_cache, kv_lens, scale):
    return _attend(q, k_cache, v_cache, kv_lens, scale)


def gqa_modulo(q, k_cache, v_cache, kv_lens, scale):
    return _attend(q, k_cache, v_cache, kv_lens, scale, group_of=lambda h, hq, hkv: h % hkv)


def zeroes_input(q, k_cache, v_cache, kv_lens, scale):
    out = _attend(q, k_cache, v_cache, kv_lens, scale)
    q.zero_()
    return out


def half_written(q, k_cache, v_cache, kv_lens, scale):
    full = _attend(q, k_cache, v_cache, kv_lens, scale)
    out = torch.empty_like(q)
    out[:, : q.shape[1] // 2] = full[:, : q.shape[1] // 2]
    return out


def caches_by_shape(q, k_cache, v_cache, kv_lens, scale):
    key = (tuple(q.shape), tuple(k_cache.shape), q.dtype)
    if key not in _CACHE:
        _CACHE[key] = _attend(q, k_cache, v_cache, kv_lens, scale)
    return _CACHE[key].clone()


def raises(q, k_cache, v_cache, kv_lens, scale):
    raise ValueError("unsupported head dim")


def _gqa1(q, k_cache):  # the dims of the engine's 'gqa-1' case
    return q.shape[0] == 4 and q.shape[1] == 4 and k_cache.shape[1] == 4 and int(q.shape[2]) == 128


def hangs_on_gqa1(q, k_cache, v_cache, kv_lens, scale):
    if _gqa1(q, k_cache):
        while True:
            pass
    return _attend(q, k_cache, v_cache, kv_lens, scale)


def segfaults_on_gqa1(q, k_cache, v_cache, kv_lens, scale):
    if _gqa1(q, k_cache):
        os.kill(os.getpid(), signal.SIGSEGV)
    return _attend(q, k_cache, v_cache, kv_lens, scale)


def prints_a_lot(q, k_cache, v_cache, kv_lens, scale):
    print("{\"event\": \"done\"}")  # a kernel's stdout must not be taken for an engine event
    return _attend(q, k_cache, v_cache, kv_lens, scale)


def reads_credentials(q, k_cache, v_cache, kv_lens, scale):
    """Kernel code that goes looking for the gate's credentials in its environment."""
    import os
    found = sorted(k for k in os.environ if "TOKEN" in k or k.startswith("KERNALIN_GITHUB_APP_"))
    if found:
        raise RuntimeError("credentials visible to the kernel: " + ", ".join(found))
    return entry(q, k_cache, v_cache, kv_lens, scale)
