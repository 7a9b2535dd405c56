"""FlashAttention-2 backward, portable Triton.

1. ``bwd_preprocess_kernel``: delta_i = rowsum(dO ∘ O), one float per query row.
2. ``flash_bwd_kernel``, one launch with two kinds of program:
   - a K/V-tile program owns a K/V tile of one KV head and loops over the query heads of its group and the
     Q tiles that see it, recomputing P from Q, K and the saved LSE (S and P never reach memory):
     dV += Pᵀ dO, dS = P ∘ (dO Vᵀ − delta), dK += dSᵀ Q. With ``DQ_ATOMIC`` "tma" or "pointer" it also adds
     dS K into a float32 dQ (not bitwise reproducible): "tma" hands each tile to the copy engine as one bulk
     reduce-add, "pointer" issues one atomic per element (the interpreter has no bulk reduce);
   - with ``DQ_ATOMIC`` "none", Q-tile programs follow in the same grid: each owns a Q tile and loops over
     the K/V tiles it sees, dQ += dS K, with no atomics (deterministic).
"""
import functools

import torch
import triton
import triton.language as tl

from ..common.online_softmax import LOG2E, alibi_slope, modified_scores, score_scales, softcap_mode
from ..common.replay import Replay, Replays, launch_key
from ..common.tiles import (
    band_mask,
    band_tiles,
    cdiv,
    head_dim_pad,
    host_descriptors,
    load_tile,
    reduce_tile,
    sequence_bounds,
    sequence_desc,
    store_tile,
)


@triton.jit
def _row_dot(o, do):
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)


@triton.jit
def bwd_preprocess_kernel(O, dO, Delta, dLSE, dQacc, cu_seqlens_q, LSE, Sinks, SinkParts, stride_ob, stride_on,
                          stride_oh, stride_db, stride_dn, stride_dh, stride_lb, stride_lh, stride_xb, stride_xh,
                          stride_xn, stride_zb, stride_zn, stride_zh, zero_rows, seqlen_q, nheads,
                          HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                          IS_VARLEN: tl.constexpr, HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr,
                          HAS_SINK: tl.constexpr):
    """delta of BLOCK_M rows of one head, minus the LSE's gradient with HAS_DLSE; with ZERO_DQ, also zeros for the
    same rows (up to zero_rows) of the float32 dQ that atomics add into after; with HAS_SINK, the rows' part of the
    head's sink gradient, −Σ exp(sink − lse_i) · delta_i, into SinkParts[h, b, program along the rows]."""
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
    delta = _row_dot(o, do)  # [BLOCK_M]
    if HAS_DLSE:
        delta -= tl.load(dLSE + b * stride_xb + h * stride_xh + rows * stride_xn, mask=offs_m < seqlen_q)
    tl.store(Delta + b * stride_lb + h * stride_lh + rows, delta, mask=offs_m < seqlen_q)
    if HAS_SINK:  # the sink's share of each row's softmax: exp(sink − lse_i); none in rows without a sequence
        lse = tl.load(LSE + b * stride_lb + h * stride_lh + rows, mask=offs_m < seqlen_q, other=float("-inf"))
        share = tl.exp(tl.load(Sinks + h) - lse)  # [BLOCK_M]
        part = tl.sum(tl.where(lse > float("-inf"), share * delta, 0.0), 0)
        blocks_m = tl.num_programs(0)
        tl.store(SinkParts + (h * (tl.num_programs(1) // nheads) + b) * blocks_m + tl.program_id(0), -part)
    if ZERO_DQ:
        tl.store(dQacc + b * stride_zb + offs_m[:, None] * stride_zn + h * stride_zh + offs_d[None, :],
                 tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32), mask=(offs_m < zero_rows)[:, None])


@triton.jit
def dq_cast_kernel(dQacc, dQ, cu_seqlens_q, stride_ab, stride_ah, stride_qb, stride_qn, stride_qh, seqlen_q, nheads,
                   scale, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                   IS_VARLEN: tl.constexpr):
    """dQ = scale · dQacc in dQ's dtype, for one 64-row Q tile of one head. dQacc holds each tile's two halves of the
    HEAD_DIM_PAD columns (dQ has HEAD_DIM of them) in the order the sm90 single-pass kernel's threads wrote them
    (kernels/hopper/bwd.py, dq_tile_order).
    Packed (IS_VARLEN): dQacc's batch is the sequence, whose rows start at cu_seqlens_q[b] in dQ (its batch stride
    0); seqlen_q (dQacc's rows) bounds each."""
    COLS: tl.constexpr = HEAD_DIM_PAD // 2
    b = (tl.program_id(1) // nheads).to(tl.int64)
    h = (tl.program_id(1) % nheads).to(tl.int64)
    q_start, rows = sequence_bounds(cu_seqlens_q, b, seqlen_q, IS_VARLEN)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, COLS)
    tile = dQacc + b * stride_ab + h * stride_ah + tl.program_id(0).to(tl.int64) * (BLOCK_M * HEAD_DIM_PAD)
    for half in tl.static_range(2):
        acc = tl.load(tile + half * BLOCK_M * COLS + tl.arange(0, BLOCK_M * COLS))  # in the threads' order
        acc = tl.reshape(tl.permute(tl.reshape(acc, [COLS // 8, 4, 8, 4, 2, 2]), (1, 4, 2, 0, 3, 5)), [BLOCK_M, COLS])
        tl.store(dQ + b * stride_qb + h * stride_qh + (q_start + offs_m)[:, None] * stride_qn + half * COLS
                 + offs_d[None, :], (acc * scale).to(dQ.dtype.element_ty),
                 mask=((offs_m < rows) & (offs_m < seqlen_q))[:, None] & (half * COLS + offs_d < HEAD_DIM)[None, :])


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, dq_acc, stride_dqn, b, h, lo, hi, offs_n,
                seqlen_q, seqlen_k, diag, left, right, qk_scale, softmax_scale, softcap_scale, slope,
                MASKED: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr,
                HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, IS_VARLEN: tl.constexpr, DQ_ATOMIC: tl.constexpr,
                SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Rows own keys, columns are queries: the band is seen from the key side (diag, left, right swapped).
    Where dS·K goes to dQ here (DQ_ATOMIC), masked tiles also give the keys past seqlen_k (the tile's zero padding)
    P = 0: their score 0 may exceed the LSE by more than a 16-bit dS holds, and inf · 0 would reach dQ as NaN."""
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    for start_m in tl.range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = load_tile(q_desc, b, start_m, h, BLOCK_M, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_M, HEAD_DIM]
        do = load_tile(do_desc, b, start_m, h, BLOCK_M, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_M, HEAD_DIM]
        lse = tl.load(lse_ptr + offs_m, mask=offs_m < seqlen_q, other=0.0) * LOG2E  # [BLOCK_M]
        delta = tl.load(delta_ptr + offs_m, mask=offs_m < seqlen_q, other=0.0)  # [BLOCK_M]
        qk_t = tl.dot(k, q.T, input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_M]
        qk_t, dscore_t = modified_scores(qk_t, softcap_scale, slope,
                                         tl.abs(offs_m[None, :] - diag - offs_n[:, None]).to(tl.float32), SOFTCAP,
                                         HAS_ALIBI)
        p_t = tl.math.exp2(qk_t * qk_scale - lse[None, :])
        if MASKED:
            ok = band_mask(offs_n, offs_m, seqlen_q, diag, left, right, MASK_LEFT, MASK_RIGHT)
            if DQ_ATOMIC != "none":
                ok &= (offs_n < seqlen_k)[:, None]
            p_t = tl.where(ok, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)  # [BLOCK_N, HEAD_DIM]
        dp_t = tl.dot(v, do.T, input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_M]
        ds_t = p_t * (dp_t - delta[None, :]) * dscore_t
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)  # [BLOCK_N, HEAD_DIM]
        if DQ_ATOMIC != "none":
            dq = tl.dot(ds_t.T.to(k.dtype), k, input_precision=DOT_PRECISION) * softmax_scale  # [BLOCK_M, HEAD_DIM]
            if DQ_ATOMIC == "tma":
                reduce_tile(dq_acc, b, start_m, h, dq, IS_VARLEN)
            else:
                dq_mask = (offs_m < seqlen_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
                tl.atomic_add(dq_acc + offs_m.to(tl.int64)[:, None] * stride_dqn + offs_d[None, :], dq, mask=dq_mask,
                              sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_program(pid_n, b, h_k, Q, K, V, dO, dK, dV, LSE, Delta, dQacc, cu_seqlens_q, cu_seqlens_k, qkv_strides,
                  stride_dkn, stride_dkh, stride_dvn, stride_dvh, lse_strides, stride_dqb, stride_dqn, stride_dqh,
                  seqlen_q, seqlen_k, group, softmax_scale, mods, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_VARLEN: tl.constexpr, DQ_ATOMIC: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, MASK_LEFT: tl.constexpr,
                  MASK_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """dK, dV of one K/V tile of KV head h_k, summed over the query heads of its group. The bundles are
    flash_bwd_kernel's (qkv_strides, lse_strides, mods)."""
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_don, stride_doh = qkv_strides
    stride_lb, stride_lh = lse_strides
    qk_scale, softcap_scale, alibi_unit, Alibi, stride_alibi_b, left, right = mods
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
        if DQ_ATOMIC != "none" and start_n + BLOCK_N > seqlen_k:  # a ragged last tile: every Q tile masked
            full_lo = lo
            full_hi = lo
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
            slope = alibi_slope(Alibi, b, stride_alibi_b, h, alibi_unit, HAS_ALIBI)
            lse_ptr = LSE + row_offset
            delta_ptr = Delta + row_offset
            if DQ_ATOMIC == "tma":
                dq_acc = sequence_desc(dQacc, q_start, stride_dqn, h * stride_dqh, seqlen_q, HEAD_DIM, BLOCK_M,
                                       HEAD_DIM_PAD) if IS_VARLEN else dQacc
            else:
                dq_acc = dQacc + b.to(tl.int64) * stride_dqb + q_start * stride_dqn + h.to(tl.int64) * stride_dqh
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, dq_acc, stride_dqn, b, h,
                                 lo, full_lo, offs_n, seqlen_q, seqlen_k, diag, right, left, qk_scale,
                                 softmax_scale, softcap_scale, slope, True, MASK_RIGHT, MASK_LEFT, BLOCK_M, HEAD_DIM,
                                 HEAD_DIM_PAD, IS_VARLEN, DQ_ATOMIC, SOFTCAP, HAS_ALIBI, DOT_PRECISION)
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, dq_acc, stride_dqn, b, h,
                                 full_lo, full_hi, offs_n, seqlen_q, seqlen_k, diag, right, left, qk_scale,
                                 softmax_scale, softcap_scale, slope, False, MASK_RIGHT, MASK_LEFT, BLOCK_M, HEAD_DIM,
                                 HEAD_DIM_PAD, IS_VARLEN, DQ_ATOMIC, SOFTCAP, HAS_ALIBI, DOT_PRECISION)
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, dq_acc, stride_dqn, b, h,
                                 full_hi, hi, offs_n, seqlen_q, seqlen_k, diag, right, left, qk_scale,
                                 softmax_scale, softcap_scale, slope, True, MASK_RIGHT, MASK_LEFT, BLOCK_M, HEAD_DIM,
                                 HEAD_DIM_PAD, IS_VARLEN, DQ_ATOMIC, SOFTCAP, HAS_ALIBI, DOT_PRECISION)
        store_tile(dk_desc, b, start_n, h_k, (dk * softmax_scale).to(k.dtype), IS_VARLEN)
        store_tile(dv_desc, b, start_n, h_k, dv.to(v.dtype), IS_VARLEN)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, k_desc, v_desc, b, h_k, lo, hi, offs_m, seqlen_k, diag, left, right,
              qk_scale, softcap_scale, slope, MASKED: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,
              BLOCK_N: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, IS_VARLEN: tl.constexpr, SOFTCAP: tl.constexpr,
              HAS_ALIBI: tl.constexpr, DOT_PRECISION: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N):
        k = load_tile(k_desc, b, start_n, h_k, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_N, HEAD_DIM]
        v = load_tile(v_desc, b, start_n, h_k, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_N, HEAD_DIM]
        qk = tl.dot(q, k.T, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        qk, dscore = modified_scores(qk, softcap_scale, slope,
                                     tl.abs((offs_m + diag)[:, None] - (start_n + tl.arange(0, BLOCK_N))[None, :])
                                     .to(tl.float32), SOFTCAP, HAS_ALIBI)
        p = tl.math.exp2(qk * qk_scale - lse[:, None])
        if MASKED:
            ok = band_mask(offs_m, start_n + tl.arange(0, BLOCK_N), seqlen_k, diag, left, right, MASK_LEFT,
                           MASK_RIGHT)
            p = tl.where(ok, p, 0.0)
        dp = tl.dot(do, v.T, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        ds = p * (dp - delta[:, None]) * dscore
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)  # [BLOCK_M, HEAD_DIM]
    return dq


@triton.jit
def _dq_program(pid_m, b, h, h_k, Q, K, V, dO, dQ, LSE, Delta, cu_seqlens_q, cu_seqlens_k, qkv_strides,
                stride_dqn, stride_dqh, lse_strides, seqlen_q, seqlen_k, softmax_scale, mods,
                HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
                MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """dQ of one Q tile of head h, with no atomics. The bundles are flash_bwd_kernel's."""
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_don, stride_doh = qkv_strides
    stride_lb, stride_lh = lse_strides
    qk_scale, softcap_scale, alibi_unit, Alibi, stride_alibi_b, left, right = mods
    q_start, seqlen_q = sequence_bounds(cu_seqlens_q, b, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = sequence_bounds(cu_seqlens_k, b, seqlen_k, IS_VARLEN)
    start_m = pid_m * BLOCK_M
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
        q = load_tile(q_desc, b, start_m, h, BLOCK_M, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_M, HEAD_DIM]
        do = load_tile(do_desc, b, start_m, h, BLOCK_M, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_M, HEAD_DIM]
        delta = tl.load(Delta + row_offset + offs_m, mask=offs_m < seqlen_q, other=0.0)
        dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
        slope = alibi_slope(Alibi, b, stride_alibi_b, h, alibi_unit, HAS_ALIBI)
        diag = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
        lo, full_lo, full_hi, hi = band_tiles(start_m, seqlen_k, diag, left, right, BLOCK_M, BLOCK_N,
                                              MASK_LEFT, MASK_RIGHT)
        dq = _dq_tiles(dq, q, do, lse, delta, k_desc, v_desc, b, h_k, lo, full_lo, offs_m, seqlen_k, diag, left,
                       right, qk_scale, softcap_scale, slope, True, MASK_LEFT, MASK_RIGHT, BLOCK_N, HEAD_DIM_PAD,
                       IS_VARLEN, SOFTCAP, HAS_ALIBI, DOT_PRECISION)
        dq = _dq_tiles(dq, q, do, lse, delta, k_desc, v_desc, b, h_k, full_lo, full_hi, offs_m, seqlen_k, diag,
                       left, right, qk_scale, softcap_scale, slope, False, MASK_LEFT, MASK_RIGHT, BLOCK_N,
                       HEAD_DIM_PAD, IS_VARLEN, SOFTCAP, HAS_ALIBI, DOT_PRECISION)
        dq = _dq_tiles(dq, q, do, lse, delta, k_desc, v_desc, b, h_k, full_hi, hi, offs_m, seqlen_k, diag, left,
                       right, qk_scale, softcap_scale, slope, True, MASK_LEFT, MASK_RIGHT, BLOCK_N, HEAD_DIM_PAD,
                       IS_VARLEN, SOFTCAP, HAS_ALIBI, DOT_PRECISION)
        store_tile(dq_desc, b, start_m, h, (dq * softmax_scale).to(q.dtype), IS_VARLEN)


@triton.jit
def flash_bwd_kernel(
    Q1, K1, V1, dO1, dK, dV, Q2, K2, V2, dO2, dQ, LSE, Delta, dQacc, cu_seqlens_q, cu_seqlens_k, Alibi,
    qkv_strides, grad_strides, lse_strides, dq_acc_strides, sizes, scales, band,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
    BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, IS_VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr, DQ_ATOMIC: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
):
    """Grid (kv_tiles [+ group · q_tiles], batch · nheads_k). The first kv_tiles programs own a K/V tile
    (Q1, K1, V1, dO1 in its tile shapes), heaviest first; with DQ_ATOMIC == "none" the rest own a Q tile of
    one head of the group (Q2, K2, V2, dO2), heaviest first, so both halves of the backward share one launch.
    Neighbouring programs share a head, so its Q, dO (and K, V) tiles are read from L2 by several programs.
    Bundles: qkv_strides (token and head strides of Q, K, V, dO), grad_strides (of dK, dV, dQ), lse_strides (batch,
    head), dq_acc_strides (batch, token, head), sizes (seqlen_q, seqlen_k, nheads_k, group, kv_tiles, q_tiles),
    scales (qk_scale, softmax_scale, softcap_scale, alibi_unit, Alibi's batch stride), band (left, right)."""
    seqlen_q, seqlen_k, nheads_k, group, kv_tiles, q_tiles = sizes
    stride_dkn, stride_dkh, stride_dvn, stride_dvh, stride_dqn, stride_dqh = grad_strides
    stride_dqab, stride_dqan, stride_dqah = dq_acc_strides
    qk_scale, softmax_scale, softcap_scale, alibi_unit, stride_alibi_b = scales
    left, right = band
    pid = tl.program_id(0)
    b = tl.program_id(1) // nheads_k
    h_k = tl.program_id(1) % nheads_k
    mods = (qk_scale, softcap_scale, alibi_unit, Alibi, stride_alibi_b, left, right)  # the scores' modifiers, band
    if pid < kv_tiles:
        _dkdv_program(pid, b, h_k, Q1, K1, V1, dO1, dK, dV, LSE, Delta, dQacc, cu_seqlens_q, cu_seqlens_k, qkv_strides,
                      stride_dkn, stride_dkh, stride_dvn, stride_dvh, lse_strides, stride_dqab, stride_dqan,
                      stride_dqah, seqlen_q, seqlen_k, group, softmax_scale, mods, HEAD_DIM, HEAD_DIM_PAD, BLOCK_M1,
                      BLOCK_N1, IS_VARLEN, DQ_ATOMIC, DOT_PRECISION, BOTTOM_RIGHT, MASK_LEFT, MASK_RIGHT, SOFTCAP,
                      HAS_ALIBI)
    elif DQ_ATOMIC == "none":
        off = pid - kv_tiles
        h = h_k * group + off // q_tiles
        _dq_program(q_tiles - 1 - off % q_tiles, b, h, h_k, Q2, K2, V2, dO2, dQ, LSE, Delta, cu_seqlens_q,
                    cu_seqlens_k, qkv_strides, stride_dqn, stride_dqh, lse_strides, seqlen_q, seqlen_k,
                    softmax_scale, mods, HEAD_DIM, HEAD_DIM_PAD, BLOCK_M2, BLOCK_N2, IS_VARLEN, DOT_PRECISION,
                    BOTTOM_RIGHT, MASK_LEFT, MASK_RIGHT, SOFTCAP, HAS_ALIBI)


_REPLAYS = Replays()  # a training loop repeats its shapes: later steps replay each launch (kernels/common/replay.py)


def launch_preprocess(out, dout, lse, cu_seqlens_q, seqlen_q, zeroed=None, dlse=None, sinks=None, replay=None,
                      found=None):
    """(delta, zeros, sink_parts): delta = rowsum(dO ∘ O) (minus ``dlse``, the LSE's gradient, where given), shaped
    like lse; with ``zeroed`` (batch mode, a shape (batch, nheads, rows, head_dim_pad)), a float32 tensor of that shape
    filled with zeros by the same launch (else None); with ``sinks`` (float32 (nheads,)), their gradient in parts,
    float32 (nheads, blocks) whose sum over blocks is d loss / d sink (else None). ``replay``: this call's launch, found
    (``found``, Replays.launch) by an earlier call of the same launch key."""
    delta = torch.empty_like(lse)
    zeros = None if zeroed is None else torch.empty(zeroed, device=out.device, dtype=torch.float32)
    parts = None
    if sinks is not None:  # a part per program, head-major
        blocks_m, batch_heads = _preprocess_grid(out, cu_seqlens_q, seqlen_q, zeros)
        parts = torch.empty(blocks_m * batch_heads, device=out.device, dtype=torch.float32).view(out.shape[-2], -1)
    tensors = (out, dout, delta, dlse, zeros, cu_seqlens_q, lse, sinks, parts)
    if replay is not None:
        replay.launch(out.device, tensors)
        return delta, zeros, parts
    key = launch_key(tensors, "delta", seqlen_q)

    def first():
        nheads, head_dim = out.shape[-2], out.shape[-1]
        is_varlen = cu_seqlens_q is not None
        lse_strides = (0, lse.stride(0)) if is_varlen else (lse.stride(0), lse.stride(1))
        dlse_strides = (0, 0, 0)
        if dlse is not None:  # any strides autograd hands over (an expanded gradient has zeros)
            dlse_strides = (0, *dlse.stride()) if is_varlen else dlse.stride()
        zero_rows = 0 if zeros is None else zeros.shape[2]
        args = (*tensors, *_strides(out), *_strides(dout), *lse_strides, *dlse_strides,
                *((zeros.stride(0), zeros.stride(2), zeros.stride(1)) if zeros is not None else (0, 0, 0)), zero_rows,
                seqlen_q, nheads)
        kwargs = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad(head_dim), BLOCK_M=64, IS_VARLEN=is_varlen,
                      HAS_DLSE=dlse is not None, ZERO_DQ=zeros is not None, HAS_SINK=sinks is not None)
        return Replay(bwd_preprocess_kernel, _preprocess_grid(out, cu_seqlens_q, seqlen_q, zeros), args, kwargs,
                      ["O", "dO", "Delta", "dLSE", "dQacc", "cu_seqlens_q", "LSE", "Sinks", "SinkParts"])
    _REPLAYS.launch(key, out.device, tensors, first, found)
    return delta, zeros, parts


def _preprocess_grid(out, cu_seqlens_q, seqlen_q, zeros):
    """bwd_preprocess_kernel's grid: 64-row blocks of the longest sequence (or of zeros' rows), batch · heads."""
    batch = cu_seqlens_q.numel() - 1 if cu_seqlens_q is not None else out.shape[0]
    return cdiv(max(seqlen_q, 0 if zeros is None else zeros.shape[2]), 64), batch * out.shape[-2]


def launch_dq_cast(dq_acc, dq, scale, cu_seqlens_q=None, replay=None, found=None):
    """dq (batch, seqlen, nheads, headdim) = scale · dq_acc (batch, nheads, 64-row Q tiles, two halves, 64 · headdim / 2
    in the sm90 single-pass kernel's thread order, flattened as bwd_hopper.dq_acc_shape); with ``cu_seqlens_q``, dq
    packed (total, nheads, headdim) and dq_acc's batch the sequences (rows past the last sequence left alone).
    ``replay``, ``found``: as launch_preprocess's."""
    if replay is not None:
        replay.launch(dq.device, (dq_acc, dq, cu_seqlens_q))
        return
    key = launch_key((dq_acc, dq, cu_seqlens_q), "cast", scale)

    def first():
        batch, nheads, rows, cols = dq_acc.shape
        varlen = cu_seqlens_q is not None
        seqlen = rows if varlen else dq.shape[1]
        args = (dq_acc, dq, cu_seqlens_q, dq_acc.stride(0), dq_acc.stride(1), *_strides(dq), seqlen, nheads, scale)
        return Replay(dq_cast_kernel, (cdiv(seqlen, 64), batch * nheads), args,
                      dict(HEAD_DIM=dq.shape[-1], HEAD_DIM_PAD=cols, BLOCK_M=64, IS_VARLEN=varlen, num_warps=4),
                      ["dQacc", "dQ", "cu_seqlens_q"])
    _REPLAYS.launch(key, dq.device, (dq_acc, dq, cu_seqlens_q), first, found)


def launch_bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
               softmax_scale, window_size, bottom_right, deterministic, config, delta, softcap=0.0,
               alibi_slopes=None):
    """Gradients into dq, dk, dv (shaped like q, k, v). Tensors as in ``launch_fwd``; ``delta`` from
    launch_preprocess (delta − dLSE)."""
    dq_atomic = "none" if deterministic else config.dq_atomic
    dq_acc = None if dq_atomic == "none" else torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    tensors = (q, k, v, dout, dk, dv, q, k, v, dout, dq, lse, delta, dq if dq_acc is None else dq_acc, cu_seqlens_q,
               cu_seqlens_k, alibi_slopes)
    key = launch_key(tensors, "bwd", max_seqlen_q, max_seqlen_k, softmax_scale, window_size, bottom_right, dq_atomic,
                     config, softcap)
    _REPLAYS.launch(key, q.device, tensors, functools.partial(
        _first_bwd_launch, tensors, max_seqlen_q, max_seqlen_k, softmax_scale, window_size, bottom_right, dq_atomic,
        config, softcap))
    if dq_acc is not None:
        dq.copy_(dq_acc)


def _first_bwd_launch(tensors, max_seqlen_q, max_seqlen_k, softmax_scale, window_size, bottom_right,
                      dq_atomic, config, softcap):
    """launch_bwd's launch through Triton, as a Replay (``tensors`` in the order of its slots)."""
    q, k, v, dout, dk, dv, _, _, _, _, dq, lse, delta, acc, cu_seqlens_q, cu_seqlens_k, alibi_slopes = tensors
    nheads, nheads_k, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    pad = head_dim_pad(head_dim)
    left, right = window_size
    c = config
    is_varlen = cu_seqlens_q is not None
    if is_varlen:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k
        lse_strides = (0, lse.stride(0))
        tiles = tensors[:11]
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        lse_strides = (lse.stride(0), lse.stride(1))
        tiles = host_descriptors(((q, c.block_m1), (k, c.block_n1), (v, c.block_n1), (dout, c.block_m1),
                                  (dk, c.block_n1), (dv, c.block_n1), (q, c.block_m2), (k, c.block_n2),
                                  (v, c.block_n2), (dout, c.block_m2), (dq, c.block_m2)), pad)
    # where the K/V-tile programs add dS·K: a bulk-reduce descriptor, a float32 pointer, or nothing (dq)
    acc_arg = acc
    if dq_atomic == "tma" and not is_varlen:
        acc_arg, = host_descriptors(((acc, c.block_m1),), pad)
    strides = tuple(s for t in (q, k, v, dout, dk, dv, dq) for s in (t.stride(-3), t.stride(-2)))
    dq_acc_strides = _strides(acc) if dq_atomic != "none" else (0, 0, 0)
    kv_tiles, q_tiles, group = cdiv(seqlen_k, c.block_n1), cdiv(seqlen_q, c.block_m2), nheads // nheads_k
    programs = kv_tiles + (group * q_tiles if dq_atomic == "none" else 0)
    qk_scale, softcap_scale, alibi_unit = score_scales(softmax_scale, softcap)
    alibi_b = alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0
    args = (*tiles, lse, delta, acc_arg, cu_seqlens_q, cu_seqlens_k, alibi_slopes, strides[:8], strides[8:],
            tuple(lse_strides), tuple(dq_acc_strides), (seqlen_q, seqlen_k, nheads_k, group, kv_tiles, q_tiles),
            (qk_scale, softmax_scale, softcap_scale, alibi_unit, alibi_b), (max(left, 0), max(right, 0)))
    kwargs = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_M1=c.block_m1, BLOCK_N1=c.block_n1, BLOCK_M2=c.block_m2,
                  BLOCK_N2=c.block_n2, IS_VARLEN=is_varlen, BOTTOM_RIGHT=bottom_right, MASK_LEFT=left >= 0,
                  MASK_RIGHT=right >= 0, DQ_ATOMIC=dq_atomic, DOT_PRECISION="ieee" if q.dtype.itemsize == 4 else "tf32",
                  SOFTCAP=softcap_mode(q.device, softcap), HAS_ALIBI=alibi_slopes is not None,
                  num_warps=c.num_warps, num_stages=c.num_stages)
    slots = ["Q1", "K1", "V1", "dO1", "dK", "dV", "Q2", "K2", "V2", "dO2", "dQ", "LSE", "Delta", "dQacc",
             "cu_seqlens_q", "cu_seqlens_k", "Alibi"]
    return Replay(flash_bwd_kernel, (programs, batch * nheads_k), args, kwargs, slots)


def _strides(t):
    """(batch, token, head) strides; packed tensors have no batch stride."""
    return (t.stride(0), t.stride(1), t.stride(2)) if t.dim() == 4 else (0, t.stride(0), t.stride(1))
