"""FlashAttention-1 forward, as the first paper has it: one program per (batch, head); the outer loop
walks the K/V tiles, the inner loop the Q tiles, and O, m and l go back to HBM after every inner step
(then are read again on the next outer step). FlashAttention-2 (kernels/portable/fwd.py) swaps the loops so each
Q tile stays on chip and O is written once; the benchmark shows what that buys."""
import math

import torch
import triton
import triton.language as tl

from ..kernels.common.online_softmax import online_softmax_step

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def fa1_kernel(Q, K, V, O, M, L, seqlen, nheads, qk_scale, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """q, k, v, o: contiguous (batch, seqlen, nheads, HEAD_DIM); o float32; m, l float32 (batch, nheads, seqlen)."""
    b = tl.program_id(0) // nheads
    h = tl.program_id(0) % nheads
    row = nheads * HEAD_DIM  # elements between consecutive tokens
    base = b.to(tl.int64) * seqlen * row + h * HEAD_DIM
    stats = (b.to(tl.int64) * nheads + h) * seqlen
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(0, seqlen, BLOCK_N):  # outer: K/V tiles, each read once
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_ptrs = base + offs_n[:, None] * row + offs_d[None, :]
        k = tl.load(K + kv_ptrs, mask=(offs_n < seqlen)[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM]
        v = tl.load(V + kv_ptrs, mask=(offs_n < seqlen)[:, None], other=0.0)
        start_m = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0  # causal: Q tiles before this one cannot see it
        for m0 in range(start_m, seqlen, BLOCK_M):  # inner: Q tiles; Q, O, m, l travel from HBM and back
            offs_m = m0 + tl.arange(0, BLOCK_M)
            q_ptrs = base + offs_m[:, None] * row + offs_d[None, :]
            row_ok = offs_m < seqlen
            q = tl.load(Q + q_ptrs, mask=row_ok[:, None], other=0.0)
            o = tl.load(O + q_ptrs, mask=row_ok[:, None], other=0.0)  # [BLOCK_M, HEAD_DIM], normalized so far
            m_i = tl.load(M + stats + offs_m, mask=row_ok, other=float("-inf"))
            l_i = tl.load(L + stats + offs_m, mask=row_ok, other=0.0)
            qk = tl.dot(q, k.T, input_precision="ieee" if Q.dtype.element_ty == tl.float32 else "tf32")
            ok = (offs_n < seqlen)[None, :]
            if CAUSAL:
                ok &= offs_n[None, :] <= offs_m[:, None]
            qk = tl.where(ok, qk, float("-inf"))
            p, alpha, m_new, l_new = online_softmax_step(m_i, l_i, qk, qk_scale, True)
            acc = o * (l_i * alpha)[:, None]
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee" if Q.dtype.element_ty == tl.float32 else "tf32")
            o = acc / tl.where(l_new == 0.0, 1.0, l_new)[:, None]
            tl.store(O + q_ptrs, o, mask=row_ok[:, None])
            tl.store(M + stats + offs_m, m_new, mask=row_ok)
            tl.store(L + stats + offs_m, l_new, mask=row_ok)
            tl.debug_barrier()  # the next outer step reads what this one wrote, through other threads


def flash_attn_v1(q, k, v, causal=False, block_m=32, block_n=32):
    """FlashAttention-1 on (batch, seqlen, nheads, headdim) tensors of equal shape; headdim a power of two
    from 16 to 128. Returns out in q's dtype. A lesson kernel: exact, not fast."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.shape != q.shape or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor shaped like q {tuple(q.shape)}")
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32) or t.dtype != q.dtype:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, like q")
    batch, seqlen, nheads, head_dim = q.shape
    if head_dim not in (16, 32, 64, 128):
        raise ValueError(f"the FlashAttention-1 lesson kernel takes head dims 16, 32, 64, 128; got {head_dim}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    m = torch.full((batch, nheads, seqlen), float("-inf"), device=q.device, dtype=torch.float32)
    l = torch.zeros((batch, nheads, seqlen), device=q.device, dtype=torch.float32)
    if q.numel():
        fa1_kernel[(batch * nheads,)](q, k, v, out, m, l, seqlen, nheads, 1.4426950408889634 / math.sqrt(head_dim),
                                      CAUSAL=causal, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n)
    return out.to(q.dtype)
