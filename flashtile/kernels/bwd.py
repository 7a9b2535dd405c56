"""FlashAttention-2 backward, portable Triton.

1. ``bwd_preprocess_kernel``: delta_i = rowsum(dO ∘ O), one float per query row.
2. ``flash_bwd_dkdv_kernel``: a program owns a K/V tile of one KV head and loops over the query heads of
   its group and the Q tiles that see it, recomputing P from Q, K and the saved LSE (S and P never
   reach memory): dV += Pᵀ dO, dS = P ∘ (dO Vᵀ − delta), dK += dSᵀ Q. With ``ATOMIC_DQ`` it also adds
   dS K into a float32 dQ with atomics (fast, not bitwise reproducible).
3. ``flash_bwd_dq_kernel``: the deterministic dQ: a program owns a Q tile and loops over K/V tiles,
   dQ += dS K, with no atomics.
"""
import torch
import triton
import triton.language as tl

from .tiles import (band_mask, band_tiles, cdiv, head_dim_pad, host_descriptors, load_tile,
                    q_tile_program, sequence_bounds, sequence_desc, store_tile)

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def bwd_preprocess_kernel(O, dO, Delta, cu_seqlens_q, stride_ob, stride_on, stride_oh, stride_db, stride_dn,
                          stride_dh, stride_lb, stride_lh, seqlen_q, nheads, HEAD_DIM: tl.constexpr,
                          HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, IS_VARLEN: tl.constexpr):
    pid_bh = tl.program_id(1)
    b = (pid_bh // nheads).to(tl.int64)
    h = (pid_bh % nheads).to(tl.int64)
    q_start, seqlen_q = sequence_bounds(cu_seqlens_q, b, seqlen_q, IS_VARLEN)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    rows = q_start + offs_m
    mask = (offs_m < seqlen_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
    o = tl.load(O + b * stride_ob + rows[:, None] * stride_on + h * stride_oh + offs_d[None, :], mask=mask)
    do = tl.load(dO + b * stride_db + rows[:, None] * stride_dn + h * stride_dh + offs_d[None, :], mask=mask)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # [BLOCK_M]
    tl.store(Delta + b * stride_lb + h * stride_lh + rows, delta, mask=offs_m < seqlen_q)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, dq_ptr, stride_dqn, b, h, lo, hi, offs_n,
                seqlen_q, diag, left, right, qk_scale, softmax_scale, MASKED: tl.constexpr, MASK_LEFT: tl.constexpr,
                MASK_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                HEAD_DIM_PAD: tl.constexpr, IS_VARLEN: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """Rows own keys, columns are queries: the band is seen from the key side (diag, left, right swapped)."""
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    for start_m in tl.range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = load_tile(q_desc, b, start_m, h, BLOCK_M, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_M, HEAD_DIM]
        do = load_tile(do_desc, b, start_m, h, BLOCK_M, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_M, HEAD_DIM]
        lse = tl.load(lse_ptr + offs_m, mask=offs_m < seqlen_q, other=0.0) * LOG2E  # [BLOCK_M]
        delta = tl.load(delta_ptr + offs_m, mask=offs_m < seqlen_q, other=0.0)  # [BLOCK_M]
        qk_t = tl.dot(k, q.T, input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_M]
        p_t = tl.math.exp2(qk_t * qk_scale - lse[None, :])
        if MASKED:
            ok = band_mask(offs_n, offs_m, seqlen_q, diag, left, right, MASK_LEFT, MASK_RIGHT)
            p_t = tl.where(ok, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)  # [BLOCK_N, HEAD_DIM]
        dp_t = tl.dot(v, do.T, input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_M]
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)  # [BLOCK_N, HEAD_DIM]
        if ATOMIC_DQ:
            dq = tl.dot(ds_t.T.to(k.dtype), k, input_precision=DOT_PRECISION) * softmax_scale  # [BLOCK_M, HEAD_DIM]
            dq_mask = (offs_m < seqlen_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
            tl.atomic_add(dq_ptr + offs_m.to(tl.int64)[:, None] * stride_dqn + offs_d[None, :], dq, mask=dq_mask,
                          sem="relaxed")
    return dk, dv


@triton.jit
def flash_bwd_dkdv_kernel(
    Q, K, V, dO, dK, dV, LSE, Delta, dQacc, cu_seqlens_q, cu_seqlens_k,
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_don, stride_doh,
    stride_dkn, stride_dkh, stride_dvn, stride_dvh, stride_lb, stride_lh, stride_dqb, stride_dqn, stride_dqh,
    seqlen_q, seqlen_k, nheads_k, group, qk_scale, softmax_scale, left, right,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // nheads_k
    h_k = pid_bh % nheads_k
    q_start, seqlen_q = sequence_bounds(cu_seqlens_q, b, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = sequence_bounds(cu_seqlens_k, b, seqlen_k, IS_VARLEN)
    start_n = pid_n * BLOCK_N
    if start_n < seqlen_k:
        if IS_VARLEN:
            k_desc = sequence_desc(K, k_start, stride_kn, h_k * stride_kh, seqlen_k, HEAD_DIM, BLOCK_N,
                                   HEAD_DIM_PAD)
            v_desc = sequence_desc(V, k_start, stride_vn, h_k * stride_vh, seqlen_k, HEAD_DIM, BLOCK_N,
                                   HEAD_DIM_PAD)
            dk_desc = sequence_desc(dK, k_start, stride_dkn, h_k * stride_dkh, seqlen_k, HEAD_DIM, BLOCK_N,
                                    HEAD_DIM_PAD)
            dv_desc = sequence_desc(dV, k_start, stride_dvn, h_k * stride_dvh, seqlen_k, HEAD_DIM, BLOCK_N,
                                    HEAD_DIM_PAD)
        else:
            k_desc, v_desc, dk_desc, dv_desc = K, V, dK, dV
        k = load_tile(k_desc, b, start_n, h_k, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_N, HEAD_DIM]
        v = load_tile(v_desc, b, start_n, h_k, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_N, HEAD_DIM]
        dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], tl.float32)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        diag = -(seqlen_k - seqlen_q) if BOTTOM_RIGHT else 0
        lo, full_lo, full_hi, hi = band_tiles(start_n, seqlen_q, diag, right, left, BLOCK_N, BLOCK_M,
                                              MASK_RIGHT, MASK_LEFT)
        for g in range(group):
            h = h_k * group + g
            if IS_VARLEN:
                q_desc = sequence_desc(Q, q_start, stride_qn, h * stride_qh, seqlen_q, HEAD_DIM, BLOCK_M,
                                       HEAD_DIM_PAD)
                do_desc = sequence_desc(dO, q_start, stride_don, h * stride_doh, seqlen_q, HEAD_DIM, BLOCK_M,
                                        HEAD_DIM_PAD)
            else:
                q_desc, do_desc = Q, dO
            row_offset = b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + q_start
            lse_ptr = LSE + row_offset
            delta_ptr = Delta + row_offset
            dq_ptr = dQacc + b.to(tl.int64) * stride_dqb + q_start * stride_dqn + h.to(tl.int64) * stride_dqh
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, dq_ptr, stride_dqn, b, h,
                                 lo, full_lo, offs_n, seqlen_q, diag, right, left, qk_scale, softmax_scale, True,
                                 MASK_RIGHT, MASK_LEFT, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, IS_VARLEN, ATOMIC_DQ,
                                 DOT_PRECISION)
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, dq_ptr, stride_dqn, b, h,
                                 full_lo, full_hi, offs_n, seqlen_q, diag, right, left, qk_scale, softmax_scale, False,
                                 MASK_RIGHT, MASK_LEFT, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, IS_VARLEN, ATOMIC_DQ,
                                 DOT_PRECISION)
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, dq_ptr, stride_dqn, b, h,
                                 full_hi, hi, offs_n, seqlen_q, diag, right, left, qk_scale, softmax_scale, True,
                                 MASK_RIGHT, MASK_LEFT, BLOCK_M, HEAD_DIM, HEAD_DIM_PAD, IS_VARLEN, ATOMIC_DQ,
                                 DOT_PRECISION)
        store_tile(dk_desc, b, start_n, h_k, (dk * softmax_scale).to(k.dtype), IS_VARLEN)
        store_tile(dv_desc, b, start_n, h_k, dv.to(v.dtype), IS_VARLEN)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, k_desc, v_desc, b, h_k, lo, hi, offs_m, seqlen_k, diag, left, right,
              qk_scale, MASKED: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,
              BLOCK_N: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, IS_VARLEN: tl.constexpr,
              DOT_PRECISION: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N):
        k = load_tile(k_desc, b, start_n, h_k, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_N, HEAD_DIM]
        v = load_tile(v_desc, b, start_n, h_k, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_N, HEAD_DIM]
        qk = tl.dot(q, k.T, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        p = tl.math.exp2(qk * qk_scale - lse[:, None])
        if MASKED:
            ok = band_mask(offs_m, start_n + tl.arange(0, BLOCK_N), seqlen_k, diag, left, right, MASK_LEFT,
                           MASK_RIGHT)
            p = tl.where(ok, p, 0.0)
        dp = tl.dot(do, v.T, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)  # [BLOCK_M, HEAD_DIM]
    return dq


@triton.jit
def flash_bwd_dq_kernel(
    Q, K, V, dO, dQ, LSE, Delta, cu_seqlens_q, cu_seqlens_k,
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_don, stride_doh,
    stride_dqn, stride_dqh, stride_lb, stride_lh,
    seqlen_q, seqlen_k, nheads, group, qk_scale, softmax_scale, left, right,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    start_m, b, h, h_k, q_start, seqlen_q, k_start, seqlen_k = q_tile_program(
        cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, nheads, group, BLOCK_M, IS_VARLEN)
    if start_m < seqlen_q:
        if IS_VARLEN:
            q_desc = sequence_desc(Q, q_start, stride_qn, h * stride_qh, seqlen_q, HEAD_DIM, BLOCK_M, HEAD_DIM_PAD)
            do_desc = sequence_desc(dO, q_start, stride_don, h * stride_doh, seqlen_q, HEAD_DIM, BLOCK_M,
                                    HEAD_DIM_PAD)
            dq_desc = sequence_desc(dQ, q_start, stride_dqn, h * stride_dqh, seqlen_q, HEAD_DIM, BLOCK_M,
                                    HEAD_DIM_PAD)
            k_desc = sequence_desc(K, k_start, stride_kn, h_k * stride_kh, seqlen_k, HEAD_DIM, BLOCK_N,
                                   HEAD_DIM_PAD)
            v_desc = sequence_desc(V, k_start, stride_vn, h_k * stride_vh, seqlen_k, HEAD_DIM, BLOCK_N,
                                   HEAD_DIM_PAD)
        else:
            q_desc, do_desc, dq_desc, k_desc, v_desc = Q, dO, dQ, K, V
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_offset = b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + q_start
        # Rows past the sequence get LSE = +inf, so their P is 0 even in unmasked tiles.
        lse = tl.load(LSE + row_offset + offs_m, mask=offs_m < seqlen_q, other=float("inf")) * LOG2E
        delta = tl.load(Delta + row_offset + offs_m, mask=offs_m < seqlen_q, other=0.0)
        q = load_tile(q_desc, b, start_m, h, BLOCK_M, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_M, HEAD_DIM]
        do = load_tile(do_desc, b, start_m, h, BLOCK_M, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_M, HEAD_DIM]
        dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
        diag = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
        lo, full_lo, full_hi, hi = band_tiles(start_m, seqlen_k, diag, left, right, BLOCK_M, BLOCK_N,
                                              MASK_LEFT, MASK_RIGHT)
        dq = _dq_tiles(dq, q, do, lse, delta, k_desc, v_desc, b, h_k, lo, full_lo, offs_m, seqlen_k, diag, left,
                       right, qk_scale, True, MASK_LEFT, MASK_RIGHT, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN,
                       DOT_PRECISION)
        dq = _dq_tiles(dq, q, do, lse, delta, k_desc, v_desc, b, h_k, full_lo, full_hi, offs_m, seqlen_k, diag,
                       left, right, qk_scale, False, MASK_LEFT, MASK_RIGHT, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN,
                       DOT_PRECISION)
        dq = _dq_tiles(dq, q, do, lse, delta, k_desc, v_desc, b, h_k, full_hi, hi, offs_m, seqlen_k, diag, left,
                       right, qk_scale, True, MASK_LEFT, MASK_RIGHT, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN,
                       DOT_PRECISION)
        store_tile(dq_desc, b, start_m, h, (dq * softmax_scale).to(q.dtype), IS_VARLEN)


def _strides(t):
    """(batch, token, head) strides; packed tensors have no batch stride."""
    return (t.stride(0), t.stride(1), t.stride(2)) if t.dim() == 4 else (0, t.stride(0), t.stride(1))


def launch_bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
               softmax_scale, window_size, bottom_right, deterministic, config):
    """Gradients into dq, dk, dv (shaped like q, k, v). Tensors as in ``launch_fwd``."""
    nheads, nheads_k, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    pad = head_dim_pad(head_dim)
    left, right = window_size
    is_varlen = cu_seqlens_q is not None
    if is_varlen:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        lse_strides = (lse.stride(0), lse.stride(1))
    delta = torch.empty_like(lse)
    bwd_preprocess_kernel[(cdiv(seqlen_q, 64), batch * nheads)](
        out, dout, delta, cu_seqlens_q, *_strides(out), *_strides(dout), *lse_strides, seqlen_q, nheads,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_M=64, IS_VARLEN=is_varlen)
    dq_acc = None if deterministic else torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    common = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, IS_VARLEN=is_varlen, BOTTOM_RIGHT=bottom_right,
                  MASK_LEFT=left >= 0, MASK_RIGHT=right >= 0,
                  DOT_PRECISION="ieee" if q.dtype.itemsize == 4 else "tf32")
    scalars = (softmax_scale * 1.4426950408889634, softmax_scale, max(left, 0), max(right, 0))

    cfg = config.dkdv
    if is_varlen:
        args = (q, k, v, dout, dk, dv)
    else:
        args = host_descriptors(((q, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n), (dout, cfg.block_m),
                                 (dk, cfg.block_n), (dv, cfg.block_n)), pad)
    strides = [s for t in (q, k, v, dout, dk, dv) for s in (t.stride(-3), t.stride(-2))]
    dq_strides = _strides(dq_acc) if dq_acc is not None else (0, 0, 0)
    flash_bwd_dkdv_kernel[(cdiv(seqlen_k, cfg.block_n), batch * nheads_k)](
        *args, lse, delta, dq_acc if dq_acc is not None else dq, cu_seqlens_q, cu_seqlens_k, *strides,
        *lse_strides, *dq_strides, seqlen_q, seqlen_k, nheads_k, nheads // nheads_k, *scalars,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ATOMIC_DQ=not deterministic, **common,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    if not deterministic:
        dq.copy_(dq_acc)
        return
    cfg = config.dq
    if is_varlen:
        args = (q, k, v, dout, dq)
    else:
        args = host_descriptors(((q, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n), (dout, cfg.block_m),
                                 (dq, cfg.block_m)), pad)
    strides = [s for t in (q, k, v, dout, dq) for s in (t.stride(-3), t.stride(-2))]
    flash_bwd_dq_kernel[(cdiv(seqlen_q, cfg.block_m), batch * nheads)](
        *args, lse, delta, cu_seqlens_q, cu_seqlens_k, *strides, *lse_strides, seqlen_q, seqlen_k, nheads,
        nheads // nheads_k, *scalars, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **common,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)

