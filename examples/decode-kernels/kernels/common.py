"""Helpers shared by the example's kernels (a change here affects every kernel that imports it)."""
import triton
import triton.language as tl


def block_d(head_dim: int) -> int:
    """Head dims are padded to a power of two inside the kernels and masked."""
    return triton.next_power_of_2(head_dim)


@triton.jit
def online_softmax_step(m, l, acc, s, v):
    """Fold one tile of scores s [N] and values v [N, D] into the running max m, sum l and output acc."""
    m_new = tl.maximum(m, tl.max(s, 0))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new)
    acc = acc * alpha + tl.sum(p[:, None] * v, 0)
    l = l * alpha + tl.sum(p, 0)
    return m_new, l, acc
