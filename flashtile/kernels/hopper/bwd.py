"""FlashAttention backward for Hopper (sm90): dK and dV by a warp-specialized Gluon kernel (D=64 and D=128; D=256
by kernels/hopper/bwd_split.py), and the launcher of every sm90 backward.

A program owns a K/V tile of 128 keys of one KV head: two consumer warpgroups hold 64 keys each, their K and
V rows loaded once into shared memory and used there as the A operand of the products (Triton's tl.dot keeps
them in registers). A loader warp streams the Q and dO tiles (64 rows) of every query head of the group
through a ring of shared-memory stages with TMA. For each Q tile a consumer issues Sᵀ = K Qᵀ and dPᵀ = V dOᵀ
together as asynchronous wgmma, runs the exponentials of Pᵀ while dPᵀ is on the tensor cores, then
dV += Pᵀ dO and dK += dSᵀ Q with Pᵀ and dSᵀ as register operands; only tiles on the causal diagonal, on a sliding
window's edges or past the keys are masked, and a program visits only the Q tiles its keys are visible
to (_q_tiles).

dQ, two designs (configs.HopperBwdConfig.single_pass):
- one pass (DQ_REDUCE): both consumers store their dSᵀ in shared memory, and each computes half of the Q tile's dQ
  columns over all 128 keys (dS K, two more products) and hands them to the copy engine, which adds them into a
  float32 dQ in L2 (cp.reduce.async.bulk.tensor; not bitwise reproducible). A consumer does this a step late, for
  the previous Q tile, so that the two warpgroups need not meet every step (the first step's products are issued
  and dropped, which keeps the loop's code one; the last tile's come after the loop). A preprocess launch writes
  delta and zeroes that dQ first, a cast launch scales it into dq after (kernels/portable/bwd.py);
- two kernels: dQ by a kernel launched first, which also writes delta = rowsum(dO ∘ O) for this one: the Gluon
  dQ kernel (kernels/hopper/bwd_dq.py), without atomics, so ``deterministic=True`` takes this design.

Tensors are read through the same 2-D (rows, row stride) views as the Hopper forward (common.view_layout):
rows past a sequence belong to its neighbour, so keys past it are masked and query rows past it get
LSE = +inf (P = 0).
"""
import torch
import triton
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate

from ... import configs
from ..common.online_softmax import LN2, LOG2E, score_scales, tanh
from ..common.replay import Replay, Replays, launch_key
from ..common.tiles import cdiv, head_dim_pad, is_causal, next_pow2
from ..portable import bwd as portable_bwd
from . import bwd_dq, bwd_split
from .bwd_dq import BwdSwitches, Switches, backward_descriptors, launch_rows, sequence, token_strides
from .common import (
    GLUON_VERSION_OK,
    allocate_tiles,
    as_tensor,
    descriptor,
    register_operand_layout,
    row_run_layout,
    same_rows,
    store_rows,
    tile_cols,
    tma_load,
    view_layout,
    views,
    wgmma_layout,
)

# The float32 dQ tiles as the copy engine reads them: plain rows (each thread's 16-byte runs land side by side).
DQ_TILE_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))


@aggregate
class Smem:
    """The program's shared memory: both warpgroups' K and V rows; a ring of Q and dO tiles with their rows' LSE (in
    log2 units) and delta (ready once loaded, free once both warpgroups are done with them); with DQ_REDUCE, the dSᵀ
    tiles both warpgroups read for dQ (ready once both stored theirs, free once both read them) and each warpgroup's
    float32 dQ tile on its way to the copy engine."""
    q: gl.shared_memory_descriptor  # [STAGES, BLOCK_M, HEAD_DIM_PAD]
    do: gl.shared_memory_descriptor
    lse: gl.shared_memory_descriptor  # [STAGES, BLOCK_M]
    delta: gl.shared_memory_descriptor
    k: gl.shared_memory_descriptor  # [2, BLOCK_N / 2, HEAD_DIM_PAD]
    v: gl.shared_memory_descriptor
    ds: gl.shared_memory_descriptor  # [2 · buffers, BLOCK_N / 2, BLOCK_M]
    dq: gl.shared_memory_descriptor  # [buffers, BLOCK_M / 64 · HEAD_DIM_PAD, 32]
    kv_bar: gl.shared_memory_descriptor
    q_ready: gl.shared_memory_descriptor
    do_ready: gl.shared_memory_descriptor
    q_free: gl.shared_memory_descriptor
    ds_ready: gl.shared_memory_descriptor
    ds_free: gl.shared_memory_descriptor

    @triton.constexpr_function
    def __init__(self, q, do, lse, delta, k, v, ds, dq, kv_bar, q_ready, do_ready, q_free, ds_ready, ds_free):
        self.q, self.do, self.lse, self.delta, self.k, self.v, self.ds, self.dq = q, do, lse, delta, k, v, ds, dq
        self.kv_bar, self.q_ready, self.do_ready = kv_bar, q_ready, do_ready
        self.q_free, self.ds_ready, self.ds_free = q_free, ds_ready, ds_free


@aggregate
class Grads:
    """Where a program's gradients go: dK and dV with their strides, the float32 dQ rows' strides per batch and head
    (dQ itself is a descriptor, passed beside); integers through common.as_tensor."""
    dK: gl.tensor
    dV: gl.tensor
    stride_dkb: gl.tensor
    stride_dkn: gl.tensor
    stride_dkh: gl.tensor
    stride_dvb: gl.tensor
    stride_dvn: gl.tensor
    stride_dvh: gl.tensor
    stride_dqb: gl.tensor
    stride_dqh: gl.tensor

    @triton.constexpr_function
    def __init__(self, dK, dV, stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh, stride_dqb,
                 stride_dqh):
        self.dK, self.dV = dK, dV
        self.stride_dkb, self.stride_dkn, self.stride_dkh = stride_dkb, stride_dkn, stride_dkh
        self.stride_dvb, self.stride_dvn, self.stride_dvh = stride_dvb, stride_dvn, stride_dvh
        self.stride_dqb, self.stride_dqh = stride_dqb, stride_dqh


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """The copy engine adds the shared-memory tile ``src`` into the tensor at ``coord`` (cp.reduce.async.bulk.tensor);
    completes like tma.async_copy_shared_to_global (tma.store_wait). Triton 3.6's Gluon has the op but no wrapper."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _program(BLOCK_N: gl.constexpr):
    """(first key of the tile, batch (or sequence), KV head)."""
    return gl.program_id(0) * BLOCK_N, gl.program_id(2), gl.program_id(1)


@gluon.jit
def _q_tiles(sw, start_n, seqlen_q, seqlen_k, diag, diag_left):
    """The Q tiles [lo, hi) that see a key of the tile starting at start_n (query i sees keys up to i + diag with
    MASK_RIGHT, from i + diag_left with MASK_LEFT); packed, none where the tile starts past its sequence's keys (the
    grid covers the longest)."""
    lo = 0
    if sw.MASK_RIGHT:
        lo = gl.maximum(start_n - diag, 0) // sw.BLOCK_M
    hi = gl.cdiv(seqlen_q, sw.BLOCK_M)
    if sw.MASK_LEFT:  # the Q tile of the last row whose window starts at the tile's last key or before
        hi = gl.maximum(gl.minimum(hi, gl.maximum(start_n + sw.BLOCK_N - 1 - diag_left + sw.BLOCK_M, 0) // sw.BLOCK_M),
                        lo)
    if sw.IS_VARLEN:
        if start_n >= seqlen_k:
            hi = lo
    return lo, hi


@gluon.jit
def _load_partition(sw, smem, vw, q_desc, k_desc, v_desc, do_desc, LSE, Delta, stride_lb, stride_lh, diag,
                    diag_left, group, cu_seqlens_q, cu_seqlens_k):
    """One warp: both consumers' K and V rows once, then Q and dO of every (query head, Q tile) in turn, and the
    tile's LSE and delta (loaded here, so that the consumers never wait on global memory)."""
    HALF_N: gl.constexpr = sw.BLOCK_N // 2
    rows_layout: gl.constexpr = gl.BlockedLayout([sw.BLOCK_M // 32], [32], [1], [0])
    start_n, b, h_k = _program(sw.BLOCK_N)
    q_row0, k_row0, seqlen_q, seqlen_k, diag, diag_left = sequence(sw, vw, b, cu_seqlens_q, cu_seqlens_k, diag,
                                                                    diag_left)
    k_row = k_row0 + h_k * vw.k_rows_h
    lse_row0 = q_row0 if sw.IS_VARLEN else 0  # packed LSE: (nheads, total rows)
    mbarrier.expect(smem.kv_bar, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
    for i in gl.static_range(2):
        tma_load(k_desc, k_row + start_n + i * HALF_N, h_k * vw.k_col_h, smem.kv_bar, smem.k.index(i))
        tma_load(v_desc, k_row + start_n + i * HALF_N, h_k * vw.k_col_h, smem.kv_bar, smem.v.index(i))
    lo, hi = _q_tiles(sw, start_n, seqlen_q, seqlen_k, diag, diag_left)
    for t in range(group * (hi - lo)):  # (query head, Q tile); stage t % STAGES in its (t // STAGES)-th round
        h = h_k * group + t // (hi - lo)
        row = q_row0 + h * vw.q_rows_h + (lo + t % (hi - lo)) * sw.BLOCK_M
        stage = t % sw.STAGES
        mbarrier.wait(smem.q_free.index(stage), ((t // sw.STAGES) & 1) ^ 1)
        mbarrier.expect(smem.q_ready.index(stage), q_desc.block_type.nbytes)
        tma_load(q_desc, row, h * vw.q_col_h, smem.q_ready.index(stage), smem.q.index(stage))
        mbarrier.expect(smem.do_ready.index(stage), do_desc.block_type.nbytes)
        tma_load(do_desc, row, h * vw.q_col_h, smem.do_ready.index(stage), smem.do.index(stage))
        # Rows past the query sequence: LSE = +inf, so P = 0 there whatever the neighbour's rows hold.
        offs_m = (lo + t % (hi - lo)) * sw.BLOCK_M + gl.arange(0, sw.BLOCK_M, layout=rows_layout)
        row_offset = b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh + lse_row0
        lse = gl.load(LSE + row_offset + offs_m, mask=offs_m < seqlen_q, other=float("inf"))
        smem.lse.index(stage).store(lse * LOG2E)
        smem.delta.index(stage).store(gl.load(Delta + row_offset + offs_m, mask=offs_m < seqlen_q, other=0.0))
        gl.thread_barrier()
        mbarrier.arrive(smem.q_ready.index(stage))  # q_ready's second arrival: the rows are stored


@gluon.jit
def _dq_products(ds_smem, k_smem, ds_ready, t, half: gl.constexpr, dq_zero, DQ_COLS: gl.constexpr):
    """dQ of step t's Q tile, columns [half·DQ_COLS, +DQ_COLS), over both warpgroups' keys, issued asynchronously
    once both have stored their dS of that step."""
    pair = (t % 2) * 2
    mbarrier.wait(ds_ready.index(t % 2), (t // 2) & 1)
    dq = warpgroup_mma(ds_smem.index(pair).permute((1, 0)), k_smem.index(0).slice(half * DQ_COLS, DQ_COLS, dim=1),
                       dq_zero, use_acc=False, is_async=True)
    return warpgroup_mma(ds_smem.index(pair + 1).permute((1, 0)),
                         k_smem.index(1).slice(half * DQ_COLS, DQ_COLS, dim=1), dq, is_async=True)


@gluon.jit
def _dq_row(sw, gr, b, h, m_tile, half: gl.constexpr):
    """Where the share of dQ of query head h's Q tile m_tile goes in dQacc (rows of 32 floats): this warpgroup's
    half."""
    tile_row = b * gr.stride_dqb + h * gr.stride_dqh + m_tile * (sw.BLOCK_M * sw.HEAD_DIM_PAD // 32)
    return tile_row + half * sw.HEAD_DIM_PAD  # (each half's 64 rows: HEAD_DIM_PAD / 2 columns, rows of 32 floats)


@gluon.jit
def _dq_reduce(dq, dq_smem, dQacc, row, half: gl.constexpr):
    """Hands this warpgroup's [BLOCK_M, DQ_COLS] share of one Q tile's dQ to the copy engine, which adds it into
    dQacc, 64 rows at a time: rows r·64.. at ``row`` + r·4·DQ_COLS (rows of 32 floats). Each 64 travel in the order
    the threads hold them (dq_tile_order): each thread writes 16-byte runs, a warp 512 contiguous bytes, one box of
    [2 · DQ_COLS, 32] floats."""
    TILES: gl.constexpr = dq.shape[0] // 64
    DQ_COLS: gl.constexpr = dq.shape[1]
    # [BLOCK_M, DQ_COLS] as (64-row tile, warp, row bit 3, lane / 4, col / 8, lane % 4, col % 2)
    y = gl.reshape(dq, [TILES, 4, 2, 8, DQ_COLS // 8, 4, 2])
    y = gl.reshape(gl.permute(y, (0, 4, 1, 3, 5, 2, 6)), [TILES * 2 * DQ_COLS, 32])
    dq_buf = dq_smem.index(half)
    tma.store_wait(0)  # the copy engine has read the previous tile
    dq_buf.store(y)
    fence_async_shared()
    for r in gl.static_range(TILES):
        tma_reduce_add(dQacc, [row + r * 4 * DQ_COLS, 0], dq_buf.slice(r * 2 * DQ_COLS, 2 * DQ_COLS))


@gluon.jit
def _consumer(half: gl.constexpr, sw, smem, vw, gr, dQacc, diag, diag_left, group, qk_scale, cu_seqlens_q,
              cu_seqlens_k):
    """One warpgroup, keys [start_n + half·64, +64): dK and dV over every Q tile of every query head."""
    HALF_N: gl.constexpr = sw.BLOCK_N // 2
    s_layout: gl.constexpr = wgmma_layout(sw.BLOCK_M)
    acc_layout: gl.constexpr = wgmma_layout(sw.HEAD_DIM_PAD)
    DQ_COLS: gl.constexpr = sw.HEAD_DIM_PAD // 2
    dq_layout: gl.constexpr = wgmma_layout(DQ_COLS)
    op_layout: gl.constexpr = register_operand_layout(acc_layout)
    dtype: gl.constexpr = smem.q.dtype
    start_n, b, h_k = _program(sw.BLOCK_N)
    _, k_row0, seqlen_q, seqlen_k, diag, diag_left = sequence(sw, vw, b, cu_seqlens_q, cu_seqlens_k, diag, diag_left)
    first_key = start_n + half * HALF_N
    last_key = first_key + HALF_N - 1
    k_half = smem.k.index(half)
    v_half = smem.v.index(half)
    offs_n = first_key + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, s_layout))  # [HALF_N] keys
    s_zero = gl.zeros([HALF_N, sw.BLOCK_M], gl.float32, layout=s_layout)
    dk = gl.zeros([HALF_N, sw.HEAD_DIM_PAD], gl.float32, layout=acc_layout)
    dv = gl.zeros([HALF_N, sw.HEAD_DIM_PAD], gl.float32, layout=acc_layout)
    dq_zero = gl.zeros([sw.BLOCK_M, DQ_COLS], gl.float32, layout=dq_layout)
    # the LSE read under the products where it is 16 registers a thread and ptxas keeps them (the one pass, 64 rows)
    LSE_EARLY: gl.constexpr = sw.DQ_REDUCE and sw.BLOCK_M == 64
    if sw.DQ_REDUCE:
        gl.static_assert((sw.BLOCK_M % 64 == 0) & (DQ_COLS % 32 == 0), "_dq_reduce's order: 64k rows, 32k columns")
    mbarrier.wait(smem.kv_bar, 0)
    lo, hi = _q_tiles(sw, start_n, seqlen_q, seqlen_k, diag, diag_left)
    TILE_ROWS: gl.constexpr = sw.BLOCK_M * sw.HEAD_DIM_PAD // 32  # a Q tile's dQ share in dQacc, rows of 32 floats
    m_tile = hi * 0 + lo - 1  # the step's Q tile, counted on in the loader's order (no division by hi - lo)
    dq_row = _dq_row(sw, gr, b, h_k * group, lo, half)  # the previous step's share's row (step 0's at first)
    for t in range(group * (hi - lo)):  # (query head, Q tile), in the loader's order
        m_tile += 1
        if m_tile == hi:  # the next query head's first tile
            m_tile = lo
        stage = t % sw.STAGES
        phase = (t // sw.STAGES) & 1
        q_tile = smem.q.index(stage)
        do_tile = smem.do.index(stage)
        offs_m = m_tile * sw.BLOCK_M + gl.arange(0, sw.BLOCK_M, layout=gl.SliceLayout(0, s_layout))
        mbarrier.wait(smem.q_ready.index(stage), phase)
        s_t = warpgroup_mma(k_half, q_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(smem.do_ready.index(stage), phase)
        dp_t = warpgroup_mma(v_half, do_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if LSE_EARLY:
            lse = smem.lse.index(stage).load(gl.SliceLayout(0, s_layout))
        s_t = warpgroup_mma_wait(1, deps=(s_t, ))  # [HALF_N, BLOCK_M]
        if not LSE_EARLY:
            lse = smem.lse.index(stage).load(gl.SliceLayout(0, s_layout))
        if sw.SOFTCAP_SCALE > 0:
            s_t = tanh(s_t * sw.SOFTCAP_SCALE, True)
        p_t = gl.exp2(s_t * qk_scale - lse[None, :])
        if sw.SOFTCAP_SCALE > 0:  # d(score)/d(q·k), 1 − tanh², in [0, 1]: fp16 holds it in half the registers
            grad_t = (1.0 - s_t * s_t).to(gl.float16)
        if sw.MASK_RIGHT or sw.MASK_LEFT:
            cut = last_key >= seqlen_k  # the end, the diagonal, the window's start
            if sw.MASK_RIGHT:
                cut = cut | (last_key > m_tile * sw.BLOCK_M + diag)
            if sw.MASK_LEFT:
                cut = cut | (first_key < m_tile * sw.BLOCK_M + sw.BLOCK_M - 1 + diag_left)
            if cut:
                ok = (offs_n < seqlen_k)[:, None]
                if sw.MASK_RIGHT:
                    ok = ok & (offs_n[:, None] <= (offs_m + diag)[None, :])
                if sw.MASK_LEFT:
                    ok = ok & (offs_n[:, None] >= (offs_m + diag_left)[None, :])
                p_t = gl.where(ok, p_t, 0.0)
        elif last_key >= seqlen_k:  # the keys pass the sequence's end
            p_t = gl.where((offs_n < seqlen_k)[:, None], p_t, 0.0)
        dp_t = warpgroup_mma_wait(0, deps=(dp_t, ))  # [HALF_N, BLOCK_M]
        delta = smem.delta.index(stage).load(gl.SliceLayout(0, s_layout))
        ds_t = p_t * (dp_t - delta[None, :])
        if sw.SOFTCAP_SCALE > 0:
            ds_t = ds_t * grad_t.to(gl.float32)
        ds_t = ds_t.to(dtype)
        dv = warpgroup_mma(gl.convert_layout(p_t.to(dtype), op_layout), do_tile, dv, is_async=True)
        if sw.DQ_REDUCE:  # dQ = dS K over both warpgroups' keys; this one takes columns [half·DQ_COLS, +DQ_COLS)
            mbarrier.wait(smem.ds_free.index(t % 2), ((t // 2) & 1) ^ 1)  # both have read step t − 2's
            smem.ds.index((t % 2) * 2 + half).store(ds_t)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(smem.ds_ready.index(t % 2))
            # the previous step's dQ, so that the other warpgroup may still be a step behind (the first step's twice)
            dq = _dq_products(smem.ds, smem.k, smem.ds_ready, gl.maximum(t - 1, 0), half, dq_zero, DQ_COLS)
            dk = warpgroup_mma(gl.convert_layout(ds_t, op_layout), q_tile, dk, is_async=True)
            dv, dq = warpgroup_mma_wait(1, deps=(dv, dq))  # dq: [BLOCK_M, DQ_COLS], handed on under dK's product
            if t > 0:
                _dq_reduce(dq, smem.dq, dQacc, dq_row, half)
                mbarrier.arrive(smem.ds_free.index((t - 1) % 2))
                dq_row += gl.where(m_tile != lo, TILE_ROWS, gr.stride_dqh - (hi - lo - 1) * TILE_ROWS)  # this step's
            dk = warpgroup_mma_wait(0, deps=(dk, ))
        else:
            dk = warpgroup_mma(gl.convert_layout(ds_t, op_layout), q_tile, dk, is_async=True)
            dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))
        mbarrier.arrive(smem.q_free.index(stage))
    if sw.DQ_REDUCE:
        steps = group * (hi - lo)
        if steps > 0:  # the last step's dQ
            dq = _dq_products(smem.ds, smem.k, smem.ds_ready, steps - 1, half, dq_zero, DQ_COLS)
            dq = warpgroup_mma_wait(0, deps=(dq, ))
            _dq_reduce(dq, smem.dq, dQacc, dq_row, half)
        tma.store_wait(0)
    k_base = k_row0 if sw.IS_VARLEN else 0  # packed dK, dV: rows of every sequence (their batch strides are 0)
    store_layout: gl.constexpr = row_run_layout(sw.HEAD_DIM_PAD)  # 16-byte runs of a row per store
    store_rows(dv, gr.dV, b, h_k, k_base + first_key, k_base + seqlen_k, gr.stride_dvb, gr.stride_dvn, gr.stride_dvh,
               store_layout, sw.HEAD_DIM)
    dk_scale = qk_scale * LN2  # the softmax scale (capped: qk_scale holds the cap, SOFTCAP_SCALE scale / cap)
    if sw.SOFTCAP_SCALE > 0:
        dk_scale = dk_scale * sw.SOFTCAP_SCALE
    store_rows(dk * dk_scale, gr.dK, b, h_k, k_base + first_key, k_base + seqlen_k, gr.stride_dkb,
               gr.stride_dkn, gr.stride_dkh, store_layout, sw.HEAD_DIM)


@gluon.jit
def flash_bwd_dkdv_hopper_kernel(q_desc, k_desc, v_desc, do_desc, dK, dV, dQacc, LSE, Delta, q_rows_b,
                                 q_rows_h, q_col_h, k_rows_b, k_rows_h, k_col_h, stride_dkb, stride_dkn, stride_dkh,
                                 stride_dvb, stride_dvn, stride_dvh, stride_dqb, stride_dqh, stride_lb,
                                 stride_lh, seqlen_q, seqlen_k, diag, diag_left, group, qk_scale, cu_seqlens_q,
                                 cu_seqlens_k, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                                 STAGES: gl.constexpr, SWITCHES: gl.constexpr, REGS: gl.constexpr):
    """Grid (K/V tiles of BLOCK_N keys of the longest sequence, KV heads, batch (or sequences)). Query i sees keys
    i + diag_left .. i + diag (SWITCHES, a bwd_dq.BwdSwitches: each bound where its side is masked). Packed
    (IS_VARLEN): sequence b's rows from cu_seqlens_q[b], cu_seqlens_k[b]; seqlen_q, seqlen_k the longest; ``diag`` 1
    for bottom-right causal, else 0, or with a window each side's offset from the sequence's diagonal
    (bwd_dq.sequence)."""
    HEAD_DIM_PAD: gl.constexpr = tile_cols(HEAD_DIM)
    sw = Switches(HEAD_DIM_PAD, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, SWITCHES)
    q_smem = allocate_tiles(q_desc, STAGES)
    do_smem = allocate_tiles(do_desc, STAGES)
    rows_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], rows_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], rows_layout)
    k_smem = allocate_tiles(k_desc, 2)
    v_smem = allocate_tiles(v_desc, 2)
    BUFS: gl.constexpr = 2 if sw.DQ_REDUCE else 1
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2 * BUFS, BLOCK_N // 2, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N // 2, BLOCK_M], q_desc.dtype))
    dq_smem = gl.allocate_shared_memory(gl.float32, [BUFS, BLOCK_M // 64 * HEAD_DIM_PAD, 32], DQ_TILE_LAYOUT)
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=2)  # Q's bytes, then the rows' LSE and delta
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(q_free.index(i), count=2)
    if sw.DQ_REDUCE:  # (no barrier set up that is never used: Triton may lay a conversion's scratch over a dead one)
        for i in gl.static_range(2):
            mbarrier.init(ds_ready.index(i), count=2)
            mbarrier.init(ds_free.index(i), count=2)
    smem = Smem(q_smem, do_smem, lse_smem, delta_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar, q_ready, do_ready,
                q_free, ds_ready, ds_free)
    vw = views(q_rows_b, q_rows_h, q_col_h, k_rows_b, k_rows_h, k_col_h, seqlen_q, seqlen_k)
    gr = Grads(dK, dV, as_tensor(stride_dkb), as_tensor(stride_dkn), as_tensor(stride_dkh), as_tensor(stride_dvb),
               as_tensor(stride_dvn), as_tensor(stride_dvh), as_tensor(stride_dqb), as_tensor(stride_dqh))
    # a batch-mode cu_seqlens (None) cannot sit in an aggregate: each partition takes the two beside it
    gl.warp_specialize([
        (_consumer, (0, sw, smem, vw, gr, dQacc, diag, diag_left, group, qk_scale, cu_seqlens_q, cu_seqlens_k)),
        (_consumer, (1, sw, smem, vw, gr, dQacc, diag, diag_left, group, qk_scale, cu_seqlens_q, cu_seqlens_k)),
        (_load_partition, (sw, smem, vw, q_desc, k_desc, v_desc, do_desc, LSE, Delta, stride_lb, stride_lh,
                           diag, diag_left, group, cu_seqlens_q, cu_seqlens_k)),
    ], [4, 1], [REGS, 24])


def supports(q, k, v, dout, window_size):
    """Calls the sm90 backward covers, in batch mode or packed (3-D q, k, v: the one pass or the split design), any
    window: a head dim of 16-byte rows whose padded head dim (tiles.head_dim_pad, as dispatch keys it) has a
    configs.BWD_HOPPER entry, bf16/fp16, views a descriptor can read (dO addressed like Q: the loader reads both at the
    same coordinates)."""
    varlen = q.dim() == 3
    if not (GLUON_VERSION_OK and q.dim() in (3, 4) and q.shape[-1] % 8 == 0
            and (head_dim_pad(q.shape[-1]), False) in configs.BWD_HOPPER and q.dtype in (torch.bfloat16, torch.float16)
            and all(t.data_ptr() % 16 == 0 for t in (q, k, v, dout))):
        return False
    layout_q, layout_k = view_layout(q, varlen), view_layout(k, varlen)
    return same_rows(view_layout(dout, varlen), layout_q) and same_rows(view_layout(v, varlen), layout_k)


def default_config(q, window_size, softcap=0.0):
    """The entry dispatch takes for the call (configs.bwd_hopper_table), by the tiles' head dim and causal or not."""
    return configs.bwd_hopper_table(softcap)[(head_dim_pad(q.shape[-1]), is_causal(window_size))]


def launch_args(q, k, v, dout, dk, dv, lse, delta, softmax_scale, window_size, bottom_right=True, config=None,
                dq_acc=None, packed=None, softcap=0.0):
    """(grid, args, kwargs) of the dK/dV launch; dk, dv shaped like k (batch, seqlen_k, nheads_k, headdim);
    ``window_size`` as bwd_dq.band's (packed: each sequence's band, _sequence); ``softcap``: flash-attn's (0: none);
    ``config`` a configs.HopperBwdConfig (default_config's by default);
    ``dq_acc`` (float32, zeroed, dq_acc_shape) takes dS·K by atomics, or None (dQ by another kernel). ``packed``:
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of packed (total, nheads, headdim) tensors (with dq_acc),
    or None."""
    config = config or default_config(q, window_size, softcap)
    block_m, block_n = config.block_m, config.block_n
    nheads, nheads_k, cols = q.shape[-2], k.shape[-2], next_pow2(q.shape[-1])
    descs, (q_rows_b, q_rows_h, q_col_h), (k_rows_b, k_rows_h, k_col_h) = backward_descriptors(
        q, k, v, dout, block_m, block_n // 2, packed is not None)
    (cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, batch, lse_strides), (mask_right, mask_left, diag, diag_left) = (
        launch_rows(q, k, lse, window_size, bottom_right, packed))
    qk_scale, softcap_scale, _ = score_scales(softmax_scale, softcap)
    grid = (cdiv(seqlen_k, block_n), nheads_k, batch)
    dq_arg = dq_acc if dq_acc is not None else lse
    dq_strides = (dq_acc.stride(0), dq_acc.stride(1)) if dq_acc is not None else (0, 0)
    if dq_acc is not None:  # rows of 32 floats: each half of a Q tile's dQ is cols of them, in dq_tile_order
        dq_arg = descriptor(dq_acc.view(-1, 32), [cols, 32], DQ_TILE_LAYOUT.value)
        dq_strides = (dq_acc.stride(0) // 32, dq_acc.stride(1) // 32)
    args = (*descs, dk, dv, dq_arg, lse, delta, q_rows_b, q_rows_h, q_col_h, k_rows_b, k_rows_h, k_col_h,
            *token_strides(dk), *token_strides(dv), *dq_strides, *lse_strides, seqlen_q, seqlen_k, diag, diag_left,
            nheads // nheads_k, qk_scale, cu_seqlens_q, cu_seqlens_k)
    switches = BwdSwitches(mask_right, mask_left, DQ_REDUCE=dq_acc is not None, IS_VARLEN=packed is not None,
                           BOTTOM_RIGHT=bottom_right, SOFTCAP_SCALE=softcap_scale)
    kwargs = dict(HEAD_DIM=q.shape[-1], BLOCK_M=block_m, BLOCK_N=block_n, STAGES=config.num_stages, SWITCHES=switches,
                  REGS=config.consumer_regs, num_warps=4, maxnreg=168)
    return grid, args, kwargs


def dq_tile_order(tile):
    """[..., 64, cols] dQ tiles (query rows, one warpgroup's columns: half the head dim) in the order _dq_reduce writes
    them: [..., 64 · cols]. The cast (kernels/portable/bwd.py, dq_cast_kernel) reads them back; tests check the two
    agree."""
    lead, cols = tile.shape[:-2], tile.shape[-1]
    y = tile.reshape(*lead, 4, 2, 8, cols // 8, 4, 2)
    n = len(lead)
    return y.permute(*range(n), *(n + i for i in (3, 0, 2, 4, 1, 5))).reshape(*lead, 64 * cols)


def dq_acc_shape(q, config, packed=None):
    """The float32 dQ the single-pass kernel adds into, (batch, nheads, Q tiles, 2 halves of the columns,
    64 · D / 2) in dq_tile_order, flattened as (batch, nheads, rows rounded up to whole Q tiles, D), D the tiles'
    head dim (common.tile_cols); ``packed`` (launch_args'): a batch entry per sequence, rows for the longest."""
    cols = next_pow2(q.shape[-1])
    if packed is None:
        return (q.shape[0], q.shape[2], cdiv(q.shape[1], config.block_m) * config.block_m, cols)
    return (packed[0].numel() - 1, q.shape[1], cdiv(packed[2], config.block_m) * config.block_m, cols)


_REPLAYS = Replays()  # a training loop repeats its shapes: later steps replay each launch (kernels/common/replay.py)


def launch_bwd_hopper(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, window_size, bottom_right,
                      deterministic=False, config=None, dlse=None, sinks=None, packed=None, replays=None, found=None,
                      softcap=0.0):
    """Every gradient. ``config.single_pass`` (and not ``deterministic``): delta first, then dK, dV here with dS·K
    added into a float32 dQ by the copy engine, then dQ cast; else two launches without atomics: first dQ, and delta of
    its rows in place of a preprocess launch (the Gluon dQ kernel, tiles ``config.dq_hopper``), then dK and dV (here,
    or by kernels/hopper/bwd_split.py with ``config.split_gradients``). ``config`` a configs.HopperBwdConfig.
    ``dlse``, the LSE's gradient (or None), enters as delta − dlse, which the preprocess launch computes in one pass
    for either design. ``sinks`` (float32 (nheads,), or None): the preprocess launch also sums their gradient's parts.
    ``packed``: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of packed (total, nheads, headdim) tensors,
    offsets the kernels may read (ops.launch_safe_offsets), the one pass or the split design (D=192, 256); rows past
    the last sequence get nothing.
    The one pass only: ``found`` (a list) gets its three launches' replays (Replays.launch), which a later call of the
    same launch keys hands back as ``replays`` to launch them without their lookups. ``window_size``: flash-attn's
    (left, right), -1 for unbounded ((-1, 0): causal; bwd_dq.band). ``softcap``: flash-attn's (0: none), in every
    design. ``config`` defaults to default_config's.
    Returns delta (− dlse), as the kernels used it, and the sinks' gradient parts (None without sinks)."""
    config = config or default_config(q, window_size, softcap)
    design = config.design(deterministic)
    if design == "one pass":
        cu_seqlens_q, seqlen_q = (None, q.shape[1]) if packed is None else (packed[0], packed[2])
        pre, dkdv, cast = replays or (None, None, None)
        delta, dq_acc, sink_parts = portable_bwd.launch_preprocess(out, dout, lse, cu_seqlens_q, seqlen_q,
                                                                   zeroed=dq_acc_shape(q, config, packed), dlse=dlse,
                                                                   sinks=sinks, replay=pre, found=found)
        _launch_dkdv(q, k, v, dout, dk, dv, lse, delta, softmax_scale, window_size, bottom_right, config, dq_acc,
                     packed, dkdv, found, softcap)
        portable_bwd.launch_dq_cast(dq_acc, dq, softmax_scale, cu_seqlens_q, cast, found)
        return delta, sink_parts
    if packed is not None and not config.split_gradients:
        raise ValueError("packed sequences take the one pass or the split design (configs.HopperBwdConfig.design)")
    delta_in = dlse is not None or sinks is not None
    cu_seqlens_q, seqlen_q = (None, q.shape[1]) if packed is None else (packed[0], packed[2])
    delta, _, sink_parts = (portable_bwd.launch_preprocess(out, dout, lse, cu_seqlens_q, seqlen_q, dlse=dlse,
                                                           sinks=sinks)
                            if delta_in else (torch.empty_like(lse), None, None))
    bwd_dq.launch_dq_hopper(dout, q, k, v, out, lse, dq, delta, softmax_scale, window_size, bottom_right,
                            config.dq_hopper, delta_in, softcap, packed)
    _launch_dkdv(q, k, v, dout, dk, dv, lse, delta, softmax_scale, window_size, bottom_right, config, packed=packed,
                 softcap=softcap)
    return delta, sink_parts


def _launch_dkdv(q, k, v, dout, dk, dv, lse, delta, softmax_scale, window_size, bottom_right, config, dq_acc=None,
                 packed=None, replay=None, found=None, softcap=0.0):
    """The dK/dV launch of ``config`` (kernels/hopper/bwd_split.py with ``split_gradients``), replayed after a key's
    first call (kernels/common/replay.py); ``packed``, ``window_size``, ``softcap`` as launch_bwd_hopper's; ``replay``,
    ``found`` as portable_bwd.launch_preprocess's."""
    tensors = (q, k, v, dout, dk, dv, lse, delta)
    cu_seqlens = () if packed is None else tuple(packed[:2])
    if config.split_gradients:
        kernel, make = bwd_split.flash_bwd_dkdv_split_kernel, bwd_split.launch_args
        slots = ["q_desc", "k_desc", "v_desc", "do_desc", "dK", "dV", "LSE", "Delta"]
    else:  # (without dq_acc, the dQacc argument is a placeholder: lse)
        kernel, make = flash_bwd_dkdv_hopper_kernel, launch_args
        slots = ["q_desc", "k_desc", "v_desc", "do_desc", "dK", "dV", "LSE", "Delta", "dQacc"]
        tensors += (lse if dq_acc is None else dq_acc, )
    tensors += cu_seqlens
    slots += ["cu_seqlens_q", "cu_seqlens_k"][:len(cu_seqlens)]
    if replay is not None:
        replay.launch(q.device, tensors)
        return
    key = launch_key((q, k, v, dout, dk, dv, lse, delta, dq_acc) + cu_seqlens, softmax_scale, window_size,
                     bottom_right, config, None if packed is None else packed[2:], softcap)

    def first():
        grid, args, kwargs = make(q, k, v, dout, dk, dv, lse, delta, softmax_scale, window_size, bottom_right, config,
                                  *(() if dq_acc is None else (dq_acc, )), softcap=softcap, packed=packed)
        return Replay(kernel, grid, args, kwargs, slots)
    _REPLAYS.launch(key, q.device, tensors, first, found)
