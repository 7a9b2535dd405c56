"""FlashAttention backward for Hopper (sm90): dQ by a warp-specialized Gluon kernel, no atomics.

A program owns a Q tile of 128 rows of one head: two consumer warpgroups hold 64 rows each, their Q and dO rows
loaded once into shared memory. A loader warp streams the K and V tiles those rows may see through a ring of
shared-memory stages with TMA. For each K/V tile a consumer issues S = Q Kᵀ and dP = dO Vᵀ together as
asynchronous wgmma, runs the exponentials of P while dP is on the tensor cores, then dQ += dS K with dS as a
register operand. Before its loop each consumer computes delta = rowsum(dO ∘ O) of its rows and writes it for
the dK/dV kernel (kernels/hopper/bwd.py) launched after this one. The mirror image of that kernel: there K/V
stay and Q/dO stream.

Tensors are read through the 2-D (rows, row stride) views of the Hopper forward (common.view_layout).
"""
from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.language.core import _aggregate as aggregate

from ..common.online_softmax import LOG2E, capped_grad, score_scales, tanh
from ..common.replay import Replay, Replays, launch_key
from ..common.tiles import cdiv, is_causal, windowed
from .common import (
    allocate_tiles,
    as_tensor,
    head_coord,
    register_operand_layout,
    row_run_layout,
    sequence_rows,
    store_rows,
    tile_cols,
    tile_descriptor,
    tile_mask,
    tma_load,
    view_layout,
    views,
    wgmma_layout,
    window_sides,
)


class BwdSwitches(NamedTuple):
    """A backward launch's compile-time switches, one constexpr argument of each sm90 backward kernel (band() and the
    launchers set them): keys past a row's last visible one masked (causal, or a window's right side), keys before its
    first visible one masked (a window's left side), delta given (the dQ kernel), dQ added by the copy engine (the
    dK/dV kernel in one pass), packed sequences (with a window: each sequence's band from its bottom-right diagonal,
    or its top-left one)."""
    MASK_RIGHT: bool
    MASK_LEFT: bool = False
    DELTA_IN: bool = False
    DQ_REDUCE: bool = False
    IS_VARLEN: bool = False
    BOTTOM_RIGHT: bool = True
    SOFTCAP_SCALE: float = 0.0  # > 0: scores capped by tanh(q·k · SOFTCAP_SCALE) (qk_scale carries the cap)


def band(window_size, seqlen_q, seqlen_k, bottom_right):
    """(MASK_RIGHT, MASK_LEFT, diag, diag_left) of a batch-mode call: query i sees keys i + diag_left .. i + diag
    (each bound only where its side is masked); ``window_size`` flash-attn's (left, right), -1 for unbounded ((-1, 0):
    causal), aligned at the bottom right (diagonal seqlen_k − seqlen_q) or top left."""
    left, right = window_size
    base = seqlen_k - seqlen_q if bottom_right else 0
    return right >= 0, left >= 0, base + max(right, 0), base - max(left, 0)


def packed_band(window_size, bottom_right, q, k):
    """(MASK_RIGHT, MASK_LEFT, diag, diag_left) of packed (total, nheads, headdim) q, k, as ``sequence`` takes them:
    ``diag`` 1 for each sequence's own diagonal (bottom-right causal) or 0; with a window both sides as offsets from
    each sequence's diagonal (common.window_sides: as the forward takes them)."""
    if windowed(window_size):
        mask_right, mask_left, right, left = window_sides(window_size, q.shape[0], k.shape[0])
        return mask_right, mask_left, right, -left
    return is_causal(window_size), False, int(bottom_right), 0


def launch_rows(q, k, lse, window_size, bottom_right, packed):
    """((cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k: the longest, sequences, the LSE's strides), (MASK_RIGHT,
    MASK_LEFT, diag, diag_left)) of a backward launch in batch mode or on ``packed`` sequences (cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k = packed or (None, None, q.shape[1], k.shape[1])
    if packed:
        return ((cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, cu_seqlens_q.numel() - 1, (0, lse.stride(0))),
                packed_band(window_size, bottom_right, q, k))
    return ((None, None, seqlen_q, seqlen_k, q.shape[0], (lse.stride(0), lse.stride(1))),
            band(window_size, seqlen_q, seqlen_k, bottom_right))


def token_strides(t):
    """(batch, token, head) strides; packed tensors have no batch stride."""
    return (t.stride(0), t.stride(1), t.stride(2)) if t.dim() == 4 else (0, t.stride(0), t.stride(1))


@gluon.jit
def sequence(sw, vw, b, cu_seqlens_q, cu_seqlens_k, diag, diag_left):
    """Sequence b's first rows in the Q and K views, its lengths and band (query i sees keys i + diag_left ..
    i + diag). Batch mode: b's rows per batch and the launch's lengths, ``diag`` and ``diag_left``; packed
    (IS_VARLEN): from cu_seqlens, ``diag`` 1 for bottom-right (each sequence's seqlen_k − seqlen_q) or 0, or with a
    window (MASK_LEFT) both sides as offsets from the sequence's diagonal (Switches.BOTTOM_RIGHT)."""
    q_row, k_row, seqlen_q, seqlen_k = sequence_rows(b, b * vw.q_rows_b, b * vw.k_rows_b, vw.seqlen_q, vw.seqlen_k,
                                                     cu_seqlens_q, cu_seqlens_k, sw.IS_VARLEN)
    if sw.IS_VARLEN:  # (the launch's seqlen_q, seqlen_k: the longest, which dQacc and the grid are sized for)
        if sw.MASK_LEFT:
            if sw.BOTTOM_RIGHT:
                diag = diag + seqlen_k - seqlen_q
                diag_left = diag_left + seqlen_k - seqlen_q
        else:
            diag = (seqlen_k - seqlen_q) * diag
        seqlen_q = gl.minimum(seqlen_q, vw.seqlen_q)
        seqlen_k = gl.minimum(seqlen_k, vw.seqlen_k)
    return q_row, k_row, seqlen_q, seqlen_k, diag, diag_left


@aggregate
class Switches:
    """What a backward launch fixes at compile time: the tiles (configs.HopperDqConfig, HopperBwdConfig) and its
    BwdSwitches: the masks; for the dQ kernel whether delta comes given (DELTA_IN) or is computed here, for the dK/dV
    kernel (kernels/hopper/bwd.py) whether it also adds dQ (DQ_REDUCE)."""
    HEAD_DIM_PAD: gl.constexpr  # the tiles' columns: HEAD_DIM, the tensors' head dim, rounded up to a power of two
    HEAD_DIM: gl.constexpr
    BLOCK_M: gl.constexpr  # Q rows: per program (dQ, half to each consumer warpgroup), per step (dK/dV)
    BLOCK_N: gl.constexpr  # keys: per K/V tile (dQ), per program (dK/dV, half to each consumer warpgroup)
    STAGES: gl.constexpr  # tiles in the ring: K/V (dQ), Q/dO (dK/dV)
    MASK_RIGHT: gl.constexpr
    MASK_LEFT: gl.constexpr
    DELTA_IN: gl.constexpr
    DQ_REDUCE: gl.constexpr
    IS_VARLEN: gl.constexpr  # packed sequences (cu_seqlens): the dK/dV kernel's one pass
    BOTTOM_RIGHT: gl.constexpr  # (packed, with MASK_LEFT: each sequence's diagonal)
    SOFTCAP_SCALE: gl.constexpr

    @triton.constexpr_function
    def __init__(self, HEAD_DIM_PAD, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, switches):
        self.HEAD_DIM_PAD, self.HEAD_DIM = gl.constexpr(HEAD_DIM_PAD), gl.constexpr(HEAD_DIM)
        self.BLOCK_M, self.BLOCK_N, self.STAGES = gl.constexpr(BLOCK_M), gl.constexpr(BLOCK_N), gl.constexpr(STAGES)
        for name, value in BwdSwitches(*switches)._asdict().items():
            setattr(self, name, gl.constexpr(value))


@aggregate
class Smem:
    """The program's shared memory: each warpgroup's Q and dO rows (loaded once: q_bar), the ring of K/V tiles (ready
    once loaded, free once both warpgroups are done with them)."""
    q: gl.shared_memory_descriptor  # [2, BLOCK_M / 2, HEAD_DIM_PAD]
    do: gl.shared_memory_descriptor
    k: gl.shared_memory_descriptor  # [STAGES, BLOCK_N, HEAD_DIM_PAD]
    v: gl.shared_memory_descriptor
    q_bar: gl.shared_memory_descriptor
    k_ready: gl.shared_memory_descriptor
    v_ready: gl.shared_memory_descriptor
    kv_free: gl.shared_memory_descriptor

    @triton.constexpr_function
    def __init__(self, q, do, k, v, q_bar, k_ready, v_ready, kv_free):
        self.q, self.do, self.k, self.v = q, do, k, v
        self.q_bar, self.k_ready, self.v_ready, self.kv_free = q_bar, k_ready, v_ready, kv_free


@aggregate
class Operands:
    """What a consumer reads and writes by pointer: O, dQ, the rows' LSE and delta, with their strides; the scale dQ
    takes (integers through common.as_tensor)."""
    O: gl.tensor
    dQ: gl.tensor
    LSE: gl.tensor
    Delta: gl.tensor
    stride_ob: gl.tensor
    stride_on: gl.tensor
    stride_oh: gl.tensor
    stride_dqb: gl.tensor
    stride_dqn: gl.tensor
    stride_dqh: gl.tensor
    stride_lb: gl.tensor
    stride_lh: gl.tensor
    softmax_scale: gl.tensor

    @triton.constexpr_function
    def __init__(self, O, dQ, LSE, Delta, stride_ob, stride_on, stride_oh, stride_dqb, stride_dqn, stride_dqh,
                 stride_lb, stride_lh, softmax_scale):
        self.O, self.dQ, self.LSE, self.Delta, self.softmax_scale = O, dQ, LSE, Delta, softmax_scale
        self.stride_ob, self.stride_on, self.stride_oh = stride_ob, stride_on, stride_oh
        self.stride_dqb, self.stride_dqn, self.stride_dqh = stride_dqb, stride_dqn, stride_dqh
        self.stride_lb, self.stride_lh = stride_lb, stride_lh


@gluon.jit
def _program(sw, nheads, group, vw, diag, diag_left, cu_seqlens_q, cu_seqlens_k):
    """(first row of the Q tile, batch (or sequence), head, KV head, first Q and K row of the head in the 2-D views,
    the K/V tiles [lo, n_tiles) to visit, of which [full_lo, n_full) need no mask, and the sequence's lengths and band
    (``sequence``)). Causal: the heaviest tiles of a head first. Packed: no tile where the Q tile starts past its
    sequence (the grid covers the longest)."""
    start_m = gl.program_id(0) * sw.BLOCK_M
    if sw.MASK_RIGHT:
        start_m = (gl.num_programs(0) - 1 - gl.program_id(0)) * sw.BLOCK_M
    b = gl.program_id(1) // nheads
    h = gl.program_id(1) % nheads
    h_k = h // group
    q_row0, k_row0, seqlen_q, seqlen_k, diag, diag_left = sequence(sw, vw, b, cu_seqlens_q, cu_seqlens_k, diag,
                                                                   diag_left)
    hi = seqlen_k
    full_hi = seqlen_k
    if sw.MASK_RIGHT:
        hi = gl.minimum(hi, start_m + sw.BLOCK_M + diag)
        full_hi = gl.minimum(full_hi, start_m + 1 + diag)
    n_tiles = gl.cdiv(gl.maximum(hi, 0), sw.BLOCK_N)
    n_full = gl.maximum(full_hi, 0) // sw.BLOCK_N
    lo = 0
    full_lo = 0
    if sw.MASK_LEFT:  # the first key of the first row's window, and of the last row's
        lo = gl.minimum(gl.maximum(start_m + diag_left, 0) // sw.BLOCK_N, n_tiles)
        full_lo = gl.minimum(gl.cdiv(gl.maximum(start_m + sw.BLOCK_M - 1 + diag_left, 0), sw.BLOCK_N), n_tiles)
        n_full = gl.maximum(n_full, full_lo)
    if sw.IS_VARLEN:
        if start_m >= seqlen_q:
            n_tiles = lo
    return (start_m, b, h, h_k, q_row0 + h * vw.q_rows_h, k_row0 + h_k * vw.k_rows_h, lo, full_lo, n_full, n_tiles,
            seqlen_q, seqlen_k, diag, diag_left)


@gluon.jit
def _load_partition(sw, smem, vw, q_desc, do_desc, k_desc, v_desc, nheads, group, diag, diag_left, cu_seqlens_q,
                    cu_seqlens_k):
    """One warp: each consumer's Q and dO rows once, then K and V of each tile into the next ring stage once
    both consumers freed it."""
    HALF_M: gl.constexpr = sw.BLOCK_M // 2
    start_m, b, h, h_k, q_row, k_row, lo, full_lo, n_full, n_tiles, _, _, _, _ = _program(
        sw, nheads, group, vw, diag, diag_left, cu_seqlens_q, cu_seqlens_k)
    for i in gl.static_range(2):
        mbarrier.expect(smem.q_bar.index(i), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma_load(q_desc, q_row + start_m + i * HALF_M, h * vw.q_col_h, smem.q_bar.index(i), smem.q.index(i))
        tma_load(do_desc, q_row + start_m + i * HALF_M, h * vw.q_col_h, smem.q_bar.index(i), smem.do.index(i))
    for j in range(lo, n_tiles):
        stage = (j - lo) % sw.STAGES
        mbarrier.wait(smem.kv_free.index(stage), (((j - lo) // sw.STAGES) & 1) ^ 1)
        mbarrier.expect(smem.k_ready.index(stage), k_desc.block_type.nbytes)
        tma_load(k_desc, k_row + j * sw.BLOCK_N, h_k * vw.k_col_h, smem.k_ready.index(stage), smem.k.index(stage))
        mbarrier.expect(smem.v_ready.index(stage), v_desc.block_type.nbytes)
        tma_load(v_desc, k_row + j * sw.BLOCK_N, h_k * vw.k_col_h, smem.v_ready.index(stage), smem.v.index(stage))


@gluon.jit
def _row_delta(O, do_tile, o_offset, stride_on, rows_start, seqlen_q, HALF_M: gl.constexpr,
               HEAD_DIM_PAD: gl.constexpr, HEAD_DIM: gl.constexpr, row_layout: gl.constexpr):
    """delta = rowsum(dO ∘ O) of HALF_M rows, O from global memory, dO from its shared-memory tile."""
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = rows_start + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, blocked))
    cols = gl.arange(0, HEAD_DIM_PAD, layout=gl.SliceLayout(0, blocked))
    o = gl.load(O + o_offset + rows.to(gl.int64)[:, None] * stride_on + cols[None, :],
                mask=tile_mask(rows < seqlen_q, cols, HEAD_DIM), other=0.0)  # [HALF_M, HEAD_DIM_PAD]
    do = do_tile.load(blocked)  # [HALF_M, HEAD_DIM_PAD]
    return gl.convert_layout(gl.sum(o.to(gl.float32) * do.to(gl.float32), axis=1), row_layout)


@gluon.jit
def _consumer(half: gl.constexpr, sw, smem, vw, ops, nheads, group, diag, diag_left, qk_scale, cu_seqlens_q,
              cu_seqlens_k):
    """One warpgroup, rows [start_m + half·64, +64): delta (or, DELTA_IN, its given value), then dQ over every K/V
    tile they may see."""
    HALF_M: gl.constexpr = sw.BLOCK_M // 2
    s_layout: gl.constexpr = wgmma_layout(sw.BLOCK_N)
    acc_layout: gl.constexpr = wgmma_layout(sw.HEAD_DIM_PAD)
    op_layout: gl.constexpr = register_operand_layout(acc_layout)
    dtype: gl.constexpr = smem.q.dtype
    start_m, b, h, h_k, q_row, k_row, lo, full_lo, n_full, n_tiles, seqlen_q, seqlen_k, diag, diag_left = _program(
        sw, nheads, group, vw, diag, diag_left, cu_seqlens_q, cu_seqlens_k)
    rows_start = start_m + half * HALF_M
    offs_m = rows_start + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))  # [HALF_M] rows
    row_offset = b.to(gl.int64) * ops.stride_lb + h.to(gl.int64) * ops.stride_lh
    o_offset = b.to(gl.int64) * ops.stride_ob + h.to(gl.int64) * ops.stride_oh
    first = 0  # the sequence's first row in O, dQ and the (nheads, total) LSE and delta (packed)
    if sw.IS_VARLEN:
        first = q_row
        row_offset += q_row
        o_offset += q_row.to(gl.int64) * ops.stride_on
    # Rows past the query sequence: LSE = +inf, so P = 0 there whatever the neighbour's rows hold.
    lse = gl.load(ops.LSE + row_offset + offs_m, mask=offs_m < seqlen_q, other=float("inf")) * LOG2E
    q_half = smem.q.index(half)
    do_half = smem.do.index(half)
    mbarrier.wait(smem.q_bar.index(half), 0)
    if sw.DELTA_IN:  # delta − dLSE, from the preprocess launch
        delta = gl.load(ops.Delta + row_offset + offs_m, mask=offs_m < seqlen_q, other=0.0)
    else:
        delta = _row_delta(ops.O, do_half, o_offset, ops.stride_on, rows_start, seqlen_q, HALF_M, sw.HEAD_DIM_PAD,
                           sw.HEAD_DIM, gl.SliceLayout(1, s_layout))
        gl.store(ops.Delta + row_offset + offs_m, delta, mask=offs_m < seqlen_q)
    s_zero = gl.zeros([HALF_M, sw.BLOCK_N], gl.float32, layout=s_layout)
    dq = gl.zeros([HALF_M, sw.HEAD_DIM_PAD], gl.float32, layout=acc_layout)
    inv_qk_scale = 1.0 / qk_scale  # (softcapped: capped_grad's)
    for j in range(lo, n_tiles):
        stage = (j - lo) % sw.STAGES
        phase = ((j - lo) // sw.STAGES) & 1
        k_tile = smem.k.index(stage)
        mbarrier.wait(smem.k_ready.index(stage), phase)
        s = warpgroup_mma(q_half, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(smem.v_ready.index(stage), phase)
        dp = warpgroup_mma(do_half, smem.v.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s, ))  # [HALF_M, BLOCK_N]
        if sw.SOFTCAP_SCALE > 0:
            s = tanh(s * sw.SOFTCAP_SCALE, True)
        p = gl.exp2(s * qk_scale - lse[:, None])
        masked = j >= n_full  # keys past the sequence, or past a row's band
        if sw.MASK_LEFT:
            masked = masked | (j < full_lo)
        if masked:
            offs_n = j * sw.BLOCK_N + gl.arange(0, sw.BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            ok = offs_n[None, :] < seqlen_k
            if sw.MASK_RIGHT:
                ok = ok & (offs_n[None, :] <= (offs_m + diag)[:, None])
            if sw.MASK_LEFT:
                ok = ok & (offs_n[None, :] >= (offs_m + diag_left)[:, None])
            p = gl.where(ok, p, 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp, ))  # [HALF_M, BLOCK_N]
        ds = p * (dp - delta[:, None])
        if sw.SOFTCAP_SCALE > 0:
            ds = ds * capped_grad(p, lse[:, None], inv_qk_scale)
        dq = warpgroup_mma(gl.convert_layout(ds.to(dtype), op_layout), k_tile, dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq, ))
        mbarrier.arrive(smem.kv_free.index(stage))

    store_rows(dq * ops.softmax_scale, ops.dQ, b, h, first + rows_start, first + seqlen_q, ops.stride_dqb,
               ops.stride_dqn, ops.stride_dqh, row_run_layout(sw.HEAD_DIM_PAD), sw.HEAD_DIM)


@gluon.jit
def flash_bwd_dq_hopper_kernel(q_desc, do_desc, k_desc, v_desc, O, dQ, LSE, Delta, nheads, group, q_rows_b, q_rows_h,
                               q_col_h, k_rows_b, k_rows_h, k_col_h, stride_ob, stride_on, stride_oh, stride_dqb,
                               stride_dqn, stride_dqh, stride_lb, stride_lh, seqlen_q, seqlen_k, diag, diag_left,
                               qk_scale, softmax_scale, cu_seqlens_q, cu_seqlens_k, HEAD_DIM: gl.constexpr,
                               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                               SWITCHES: gl.constexpr, REGS: gl.constexpr):
    """Grid (Q tiles of BLOCK_M rows, batch · nheads). Query i sees keys i + diag_left .. i + diag (SWITCHES, a
    BwdSwitches: each bound where its side is masked). Packed (IS_VARLEN): sequence b's rows from cu_seqlens_q[b],
    cu_seqlens_k[b], seqlen_q and seqlen_k the longest, ``diag`` and ``diag_left`` as ``sequence`` takes them."""
    HEAD_DIM_PAD: gl.constexpr = tile_cols(HEAD_DIM)
    q_smem = allocate_tiles(q_desc, 2)
    do_smem = allocate_tiles(do_desc, 2)
    k_smem = allocate_tiles(k_desc, STAGES)
    v_smem = allocate_tiles(v_desc, STAGES)
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bar.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_free.index(i), count=2)
    sw = Switches(HEAD_DIM_PAD, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, SWITCHES)
    smem = Smem(q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_free)
    vw = views(q_rows_b, q_rows_h, q_col_h, k_rows_b, k_rows_h, k_col_h, seqlen_q, seqlen_k)
    ops = Operands(O, dQ, LSE, Delta, as_tensor(stride_ob), as_tensor(stride_on), as_tensor(stride_oh),
                   as_tensor(stride_dqb), as_tensor(stride_dqn), as_tensor(stride_dqh), as_tensor(stride_lb),
                   as_tensor(stride_lh), softmax_scale)
    gl.warp_specialize([
        (_consumer, (0, sw, smem, vw, ops, nheads, group, diag, diag_left, qk_scale, cu_seqlens_q, cu_seqlens_k)),
        (_consumer, (1, sw, smem, vw, ops, nheads, group, diag, diag_left, qk_scale, cu_seqlens_q, cu_seqlens_k)),
        (_load_partition, (sw, smem, vw, q_desc, do_desc, k_desc, v_desc, nheads, group, diag, diag_left,
                           cu_seqlens_q, cu_seqlens_k)),
    ], [4, 1], [REGS, 24])
    # Released only here, so that no partition's scratch (delta's layout change) is placed in a barrier's bytes while
    # another partition may still wait on it: the allocator sees a barrier live up to its last use in the kernel.
    for i in gl.static_range(2):
        mbarrier.invalidate(q_bar.index(i))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(i))
        mbarrier.invalidate(v_ready.index(i))
        mbarrier.invalidate(kv_free.index(i))


def backward_descriptors(q, k, v, dout, q_block, k_block, varlen=False):
    """What every sm90 backward launch reads through TMA (calls bwd_hopper.supports accepts): descriptors of Q, K, V
    and dO over their views (common.tile_descriptor) in boxes of ``q_block`` rows (Q, dO) and ``k_block`` rows (K, V),
    and the views' row arithmetic, (rows per batch, rows per head, column of a head: common.head_coord) for Q (dO is
    addressed like it) and for K; ``varlen``: packed (total, nheads, headdim) tensors."""
    q_layout, k_layout = view_layout(q, varlen), view_layout(k, varlen)
    dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    descs = tuple(tile_descriptor(t, view_layout(t, varlen), block, dtype)
                  for t, block in ((q, q_block), (k, k_block), (v, k_block), (dout, q_block)))
    return descs, head_coord(q_layout, q.shape[-1]), head_coord(k_layout, q.shape[-1])


def launch_args(q, k, v, out, dout, dq, lse, delta, softmax_scale, window_size, bottom_right, config, delta_in=False,
                softcap=0.0, packed=None):
    """(grid, args, kwargs) of the dQ launch (calls bwd_hopper.supports accepts); ``config`` a configs.HopperDqConfig.
    Writes delta into ``delta`` (shaped like lse), or with ``delta_in`` reads it from there, and dQ into ``dq`` (shaped
    like q). ``window_size``: as band's; ``softcap``: flash-attn's (0: none); ``packed``: (cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k) of packed (total, nheads, headdim) tensors, or None."""
    block_m, block_n = config.block_m, config.block_n
    nheads, nheads_k, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    (q_desc, k_desc, v_desc, do_desc), q_rows, k_rows = backward_descriptors(q, k, v, dout, block_m // 2, block_n,
                                                                             packed is not None)
    (cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, batch, lse_strides), (mask_right, mask_left, diag, diag_left) = (
        launch_rows(q, k, lse, window_size, bottom_right, packed))
    qk_scale, softcap_scale, _ = score_scales(softmax_scale, softcap)
    grid = (cdiv(seqlen_q, block_m), batch * nheads)
    args = (q_desc, do_desc, k_desc, v_desc, out, dq, lse, delta, nheads, nheads // nheads_k, *q_rows, *k_rows,
            *token_strides(out), *token_strides(dq), *lse_strides, seqlen_q, seqlen_k, diag, diag_left, qk_scale,
            softmax_scale, cu_seqlens_q, cu_seqlens_k)
    switches = BwdSwitches(mask_right, mask_left, DELTA_IN=delta_in, IS_VARLEN=packed is not None,
                           BOTTOM_RIGHT=bottom_right, SOFTCAP_SCALE=softcap_scale)
    kwargs = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=config.num_stages, SWITCHES=switches,
                  REGS=config.consumer_regs, num_warps=4, maxnreg=168)
    return grid, args, kwargs


_REPLAYS = Replays()  # a training loop repeats its shapes: later steps replay each launch (kernels/common/replay.py)


def launch_dq_hopper(dout, q, k, v, out, lse, dq, delta, softmax_scale, window_size, bottom_right, config,
                     delta_in=False, softcap=0.0, packed=None):
    """dQ (and delta, unless ``delta_in``) by the launch of ``launch_args``, replayed after a key's first call."""
    cu_seqlens = () if packed is None else tuple(packed[:2])
    tensors = (q, dout, k, v, out, dq, lse, delta) + cu_seqlens
    key = launch_key(tensors, softmax_scale, window_size, bottom_right, config, delta_in, softcap,
                     None if packed is None else packed[2:])

    def first():
        grid, args, kwargs = launch_args(q, k, v, out, dout, dq, lse, delta, softmax_scale, window_size,
                                         bottom_right, config, delta_in, softcap, packed)
        return Replay(flash_bwd_dq_hopper_kernel, grid, args, kwargs,
                      ["q_desc", "do_desc", "k_desc", "v_desc", "O", "dQ", "LSE", "Delta", "cu_seqlens_q",
                       "cu_seqlens_k"][:8 + len(cu_seqlens)])
    _REPLAYS.launch(key, q.device, tensors, first)
