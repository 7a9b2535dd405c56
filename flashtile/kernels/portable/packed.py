"""Packed (varlen) tensors: the offsets made safe, and the rows no sequence owns.

``launch_safe_offsets``: the kernels index a packed tensor by cu_seqlens, read on the device (no host sync).
Offsets clamped to [0, total] and made non-decreasing stand in for the given ones, so that no value of cu_seqlens
makes a kernel touch memory outside its tensors; valid offsets come back unchanged.

``launch_zero_unused_rows``: rows from cu_seqlens[-1] on belong to no sequence (flash-attn's varlen functions leave
them out); they get 0 (and LSE = −inf), so that a caller never reads memory that nothing wrote. The grid covers every
row: programs whose rows all lie inside the sequences return after one load. ``launch_zero_unused_grads`` does the
same for the backward's dq, dk and dv in one launch (the kernels write every row of every sequence).
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
def zero_rows(X, first, end, total, stride_x, row_elems, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Zero X's rows [first, first + BLOCK_R) that lie in [end, total): rows of ``row_elems`` contiguous elements,
    ``stride_x`` apart. Returns which rows those were [BLOCK_R]."""
    rows = first + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    unused = (rows >= end) & (rows < total)
    offs_r = rows.to(tl.int64)[:, None] * stride_x
    for c in range(0, row_elems, BLOCK_C):
        cols = c + tl.arange(0, BLOCK_C)  # [BLOCK_C]
        tl.store(X + offs_r + cols[None, :], tl.zeros([BLOCK_R, BLOCK_C], X.dtype.element_ty),
                 mask=unused[:, None] & (cols < row_elems)[None, :])
    return unused


@triton.jit
def zero_unused_rows_kernel(X, LSE, cu_seqlens, batch, total, stride_x, stride_lh, row_elems, nheads,
                            HAS_LSE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Grid (cdiv(total, BLOCK_R), ). X: rows of ``row_elems`` contiguous elements, ``stride_x`` apart;
    LSE (nheads, total) with head stride ``stride_lh``."""
    end = tl.load(cu_seqlens + batch)
    first = tl.program_id(0) * BLOCK_R
    if first + BLOCK_R > end:
        unused = zero_rows(X, first, end, total, stride_x, row_elems, BLOCK_R, BLOCK_C)
        if HAS_LSE:
            lse_ptr = LSE + first + tl.arange(0, BLOCK_R)
            for _ in range(nheads):
                tl.store(lse_ptr, tl.full([BLOCK_R], float("-inf"), tl.float32), mask=unused)
                lse_ptr += stride_lh


@triton.jit
def zero_unused_grads_kernel(dQ, dK, dV, cu_seqlens_q, cu_seqlens_k, batch, totals, row_strides, row_elems,
                             BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Grid (cdiv(the larger total, BLOCK_R), 2): dQ's rows from cu_seqlens_q[batch] on, then dK's and dV's (the same
    rows) from cu_seqlens_k[batch] on. Bundles: totals (q rows, k rows), row_strides (dQ, dK, dV), row_elems (q, k)."""
    total_q, total_k = totals
    stride_dq, stride_dk, stride_dv = row_strides
    elems_q, elems_k = row_elems
    first = tl.program_id(0) * BLOCK_R
    if tl.program_id(1) == 0:
        end = tl.load(cu_seqlens_q + batch)
        if first + BLOCK_R > end:
            zero_rows(dQ, first, end, total_q, stride_dq, elems_q, BLOCK_R, BLOCK_C)
    else:
        end = tl.load(cu_seqlens_k + batch)
        if first + BLOCK_R > end:
            zero_rows(dK, first, end, total_k, stride_dk, elems_k, BLOCK_R, BLOCK_C)
            zero_rows(dV, first, end, total_k, stride_dv, elems_k, BLOCK_R, BLOCK_C)


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


def _rows_of(name, x):
    """x's rows (total, nheads · headdim) as the zeroing kernels take them: its last two dims contiguous."""
    total, nheads, head_dim = x.shape
    if x.stride(2) != 1 or x.stride(1) != head_dim:
        raise ValueError(f"{name} must have its (nheads, headdim) dims contiguous, got strides {x.stride()}")
    return total, nheads * head_dim


def launch_zero_unused_rows(x, cu_seqlens, lse=None):
    """Zero the rows of x (total, nheads, headdim; its last two dims contiguous) from cu_seqlens[-1] on, and set
    lse (nheads, total) to −inf there."""
    total, nheads, head_dim = x.shape
    if total == 0:
        return
    _rows_of("x", x)
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


def launch_zero_unused_grads(dq, dk, dv, cu_seqlens_q, cu_seqlens_k):
    """Zero dq's rows from cu_seqlens_q[-1] on and dk's, dv's from cu_seqlens_k[-1] on, in one launch: the rows no
    sequence owns, which the backward kernels leave alone. Each (total, nheads, headdim), its last two dims
    contiguous."""
    (total_q, elems_q), (total_k, elems_k), _ = _rows_of("dq", dq), _rows_of("dk", dk), _rows_of("dv", dv)
    if max(total_q, total_k) == 0:
        return
    tensors = (dq, dk, dv, cu_seqlens_q, cu_seqlens_k)
    key = launch_key(tensors, "zero grads")
    replay = _REPLAYS.get(key)
    if replay is not None:
        replay.run(dq.device, *tensors)
        return
    args = (*tensors, cu_seqlens_q.numel() - 1, (total_q, total_k), (dq.stride(0), dk.stride(0), dv.stride(0)),
            (elems_q, elems_k))
    _REPLAYS.put(key, Replay(zero_unused_grads_kernel, (cdiv(max(total_q, total_k), BLOCK_R), 2), args,
                             dict(BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, num_warps=4),
                             ["dQ", "dK", "dV", "cu_seqlens_q", "cu_seqlens_k"]))
