"""A decode-attention kernel over a token-level KV pool: k_buffer [num_tokens, Hkv, D] and a
req_to_token [num_requests, max_len] table of token indices, with the request of each batch row in
b_req_idx (the layout of several serving stacks). Test-only: the worked example of docs/adapters.md."""
import triton
import triton.language as tl


@triton.jit
def _decode_tokens(q, k_buffer, v_buffer, o, req_to_token, b_req_idx, b_seq_len, sm_scale,
                   s_qb, s_qh, s_kt, s_kh, s_vt, s_vh, s_rr, s_ob, s_oh,
                   GROUP: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GROUP
    d = tl.arange(0, BLOCK_D)
    dm = d < HEAD_DIM
    req = tl.load(b_req_idx + b).to(tl.int64)
    seq_len = tl.load(b_seq_len + b)
    qv = tl.load(q + b * s_qb + h * s_qh + d, mask=dm, other=0.0).to(tl.float32)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        mask = pos < seq_len
        tok = tl.load(req_to_token + req * s_rr + pos, mask=mask, other=0).to(tl.int64)
        k = tl.load(k_buffer + tok[:, None] * s_kt + kvh * s_kh + d[None, :],
                    mask=mask[:, None] & dm[None, :], other=0.0).to(tl.float32)
        s = tl.where(mask, tl.sum(k * qv[None, :], 1) * sm_scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_buffer + tok[:, None] * s_vt + kvh * s_vh + d[None, :],
                    mask=mask[:, None] & dm[None, :], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(o + b * s_ob + h * s_oh + d, (acc / l_i).to(o.dtype.element_ty), mask=dm)


def decode_attention_fwd(q, k_buffer, v_buffer, o, req_to_token, b_req_idx, b_seq_len, sm_scale):
    """Writes o [B, Hq, D] in place."""
    B, Hq, D = q.shape
    Hkv = k_buffer.shape[1]
    _decode_tokens[(B, Hq)](q, k_buffer, v_buffer, o, req_to_token, b_req_idx, b_seq_len, sm_scale,
                            q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
                            v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
                            o.stride(0), o.stride(1), GROUP=Hq // Hkv, BLOCK_N=32, HEAD_DIM=D,
                            BLOCK_D=triton.next_power_of_2(D))
