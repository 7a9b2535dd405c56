"""Packed (varlen) tensors: the offsets made safe, and the rows no sequence owns.

``launch_safe_offsets``: the kernels index a packed tensor by cu_seqlens, read on the device (no host sync).
Offsets clamped to [0, total] and made non-decreasing stand in for the given ones, so that no value of cu_seqlens
makes a kernel touch memory outside its tensors; valid offsets come back unchanged.

``launch_zero_unused_rows``: rows from cu_seqlens[-1] on belong to no sequence (flash-attn's varlen functions leave
them out); they get 0 (and LSE = −inf), so that a caller never reads memory that nothing wrote. The grid covers every
row: programs whose rows all lie inside the sequences return after one load.
"""
import torch
import triton
import triton.language as tl

from ..common.replay import Replay, Replays, launch_key
from ..common.tiles import cdiv, next_pow2

BLOCK_R, BLOCK_C = 16, 256


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def _safe(cu, out, total, offs, ok):
    x = tl.minimum(tl.maximum(tl.load(cu + offs, mask=ok, other=0), 0), total)  # [BLOCK]
    tl.store(out + offs, tl.associative_scan(x, 0, _larger), mask=ok)


@triton.jit
def safe_offsets_kernel(CU_Q, CU_K, Out, n, total_q, total_k, BLOCK: tl.constexpr):
    """One program: Out[0] = cu_q and Out[1] = cu_k, each clamped to [0, total] and then a running maximum."""
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    _safe(CU_Q, Out, total_q, offs, ok)
    _safe(CU_K, Out + n, total_k, offs, ok)


@triton.jit
def zero_unused_rows_kernel(X, LSE, cu_seqlens, batch, total, stride_x, stride_lh, row_elems, nheads,
                            HAS_LSE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Grid (cdiv(total, BLOCK_R), ). X: rows of ``row_elems`` contiguous elements, ``stride_x`` apart;
    LSE (nheads, total) with head stride ``stride_lh``."""
    end = tl.load(cu_seqlens + batch)
    first = tl.program_id(0) * BLOCK_R
    if first + BLOCK_R > end:
        rows = first + tl.arange(0, BLOCK_R)  # [BLOCK_R]
        unused = (rows >= end) & (rows < total)
        offs_r = rows.to(tl.int64)[:, None] * stride_x
        for c in range(0, row_elems, BLOCK_C):
            cols = c + tl.arange(0, BLOCK_C)  # [BLOCK_C]
            tl.store(X + offs_r + cols[None, :], tl.zeros([BLOCK_R, BLOCK_C], X.dtype.element_ty),
                     mask=unused[:, None] & (cols < row_elems)[None, :])
        if HAS_LSE:
            lse_ptr = LSE + rows
            for _ in range(nheads):
                tl.store(lse_ptr, tl.full([BLOCK_R], float("-inf"), tl.float32), mask=unused)
                lse_ptr += stride_lh


_REPLAYS = Replays()


def launch_safe_offsets(cu_seqlens_q, cu_seqlens_k, total_q, total_k):
    """(cu_seqlens_q, cu_seqlens_k) as the kernels may read them: new int32 tensors, each offset clamped to
    [0, total] and no smaller than the one before it."""
    n = cu_seqlens_q.numel()
    out = torch.empty(2, n, dtype=torch.int32, device=cu_seqlens_q.device)
    key = launch_key((cu_seqlens_q, cu_seqlens_k, out), "offsets", total_q, total_k)
    replay = _REPLAYS.get(key)
    if replay is not None:
        replay.run(out.device, cu_seqlens_q, cu_seqlens_k, out)
    else:
        _REPLAYS.put(key, Replay(safe_offsets_kernel, (1, ), (cu_seqlens_q, cu_seqlens_k, out, n, total_q, total_k),
                                 dict(BLOCK=next_pow2(n), num_warps=4), ["CU_Q", "CU_K", "Out"]))
    return out[0], out[1]


def launch_zero_unused_rows(x, cu_seqlens, lse=None):
    """Zero the rows of x (total, nheads, headdim; its last two dims contiguous) from cu_seqlens[-1] on, and set
    lse (nheads, total) to −inf there."""
    total, nheads, head_dim = x.shape
    if total == 0:
        return
    if x.stride(2) != 1 or x.stride(1) != head_dim:
        raise ValueError(f"x must have its (nheads, headdim) dims contiguous, got strides {x.stride()}")
    key = launch_key((x, lse, cu_seqlens), "zero rows")
    replay = _REPLAYS.get(key)
    if replay is not None:
        replay.run(x.device, x, lse, cu_seqlens)
        return
    args = (x, lse, cu_seqlens, cu_seqlens.numel() - 1, total, x.stride(0), 0 if lse is None else lse.stride(0),
            nheads * head_dim, nheads)
    kwargs = dict(HAS_LSE=lse is not None, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, num_warps=4)
    _REPLAYS.put(key, Replay(zero_unused_rows_kernel, (cdiv(total, BLOCK_R), ), args, kwargs,
                             ["X", "LSE", "cu_seqlens"]))
