"""FlashAttention backward for Hopper (sm90), wide heads (D=256): dK and dV by one warpgroup each.

At D=256 a warpgroup cannot hold both of a key tile's float32 gradients (two [64, 256] accumulators are 256
registers a thread), so the two consumer warpgroups of a program share its 64 keys and split the work by gradient:
- the dV warpgroup computes Sᵀ = K Qᵀ and Pᵀ = exp2(Sᵀ · scale − LSE) (masked), hands Pᵀ in 16 bits to the
  other through shared memory, and adds dV += Pᵀ dO with Pᵀ as the register operand;
- the dK warpgroup computes dPᵀ = V dOᵀ meanwhile, takes Pᵀ, forms dSᵀ = Pᵀ ∘ (dPᵀ − delta) and adds
  dK += dSᵀ Q.
Each warpgroup runs two of a step's four products. A loader warp loads K and V once, then streams Q and dO of every
(query head of the group, Q tile) through a ring with TMA. dQ comes from the Gluon dQ kernel launched first
(kernels/hopper/bwd_dq.py), which also writes delta: no atomics, so the gradients are bitwise reproducible.

Tensors are read through the 2-D (rows, row stride) views of the Hopper forward (common.view_layout): rows past a
sequence belong to its neighbour, so keys past it are masked and query rows past it get LSE = +inf.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.language.core import _aggregate as aggregate

from ..common.online_softmax import LOG2E, score_scales, tanh
from ..common.tiles import cdiv
from .bwd_dq import BwdSwitches, backward_descriptors, launch_rows, sequence, token_strides
from .common import (
    Views,
    allocate_tiles,
    as_tensor,
    register_operand_layout,
    row_run_layout,
    store_rows,
    tile_cols,
    tma_load,
    views,
    wgmma_layout,
)


@aggregate
class Smem:
    """The program's shared memory: K and V of its keys; a ring of Q and dO tiles (ready once loaded, free once both
    warpgroups are done with them); two Pᵀ tiles passed from the dV warpgroup to the dK warpgroup."""
    k: gl.shared_memory_descriptor  # [BLOCK_N, HEAD_DIM_PAD]
    v: gl.shared_memory_descriptor
    q: gl.shared_memory_descriptor  # [STAGES, BLOCK_M, HEAD_DIM_PAD]
    do: gl.shared_memory_descriptor
    p: gl.shared_memory_descriptor  # [2, BLOCK_N, BLOCK_M]
    kv_bar: gl.shared_memory_descriptor
    q_ready: gl.shared_memory_descriptor
    do_ready: gl.shared_memory_descriptor
    q_free: gl.shared_memory_descriptor
    p_ready: gl.shared_memory_descriptor
    p_free: gl.shared_memory_descriptor

    @constexpr_function
    def __init__(self, k, v, q, do, p, kv_bar, q_ready, do_ready, q_free, p_ready, p_free):
        self.k, self.v, self.q, self.do, self.p = k, v, q, do, p
        self.kv_bar, self.q_ready, self.do_ready, self.q_free = kv_bar, q_ready, do_ready, q_free
        self.p_ready, self.p_free = p_ready, p_free


@aggregate
class Problem:
    """What every partition knows of the launch: sizes, where a head's rows sit (common.Views; dO's as Q's), scales,
    the LSE and delta rows, and the tile shapes."""
    nheads_k: gl.tensor
    group: gl.tensor
    views: Views
    diag: gl.tensor  # MASK_RIGHT: query i sees keys up to i + diag
    diag_left: gl.tensor  # MASK_LEFT: ... and from i + diag_left
    qk_scale: gl.tensor  # softmax_scale · log2(e) (softcapped: the cap · log2(e))
    LSE: gl.tensor
    Delta: gl.tensor
    stride_lb: gl.tensor
    stride_lh: gl.tensor
    HEAD_DIM_PAD: gl.constexpr  # the tiles' columns: HEAD_DIM, the tensors' head dim, rounded up to a power of two
    HEAD_DIM: gl.constexpr
    BLOCK_M: gl.constexpr  # Q rows per step
    BLOCK_N: gl.constexpr  # keys per program
    STAGES: gl.constexpr
    MASK_RIGHT: gl.constexpr  # (bwd_dq.BwdSwitches)
    MASK_LEFT: gl.constexpr
    SOFTCAP_SCALE: gl.constexpr
    IS_VARLEN: gl.constexpr  # packed sequences (cu_seqlens)
    BOTTOM_RIGHT: gl.constexpr

    @constexpr_function
    def __init__(self, nheads_k, group, views, diag, diag_left, qk_scale, LSE, Delta, stride_lb, stride_lh,
                 HEAD_DIM_PAD, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, switches):
        self.nheads_k, self.group, self.views, self.diag, self.qk_scale = nheads_k, group, views, diag, qk_scale
        self.diag_left = diag_left
        self.LSE, self.Delta, self.stride_lb, self.stride_lh = LSE, Delta, stride_lb, stride_lh
        self.HEAD_DIM_PAD = gl.constexpr(HEAD_DIM_PAD)
        self.HEAD_DIM = gl.constexpr(HEAD_DIM)
        self.BLOCK_M = gl.constexpr(BLOCK_M)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.STAGES = gl.constexpr(STAGES)
        switches = BwdSwitches(*switches)
        self.MASK_RIGHT, self.MASK_LEFT = gl.constexpr(switches.MASK_RIGHT), gl.constexpr(switches.MASK_LEFT)
        self.SOFTCAP_SCALE = gl.constexpr(switches.SOFTCAP_SCALE)
        self.IS_VARLEN, self.BOTTOM_RIGHT = gl.constexpr(switches.IS_VARLEN), gl.constexpr(switches.BOTTOM_RIGHT)

    @gluon.jit
    def program(self, cu_seqlens_q, cu_seqlens_k):
        """(first key of the tile, batch (or sequence), KV head, and bwd_dq.sequence's first Q and K rows, lengths
        and band of that sequence)."""
        b = gl.program_id(1) // self.nheads_k
        q_row0, k_row0, seqlen_q, seqlen_k, diag, diag_left = sequence(self, self.views, b, cu_seqlens_q, cu_seqlens_k,
                                                                       self.diag, self.diag_left)
        return (gl.program_id(0) * self.BLOCK_N, b, gl.program_id(1) % self.nheads_k, q_row0, k_row0, seqlen_q,
                seqlen_k, diag, diag_left)

    @gluon.jit
    def steps(self, start_n, seqlen_q, seqlen_k, diag, diag_left):
        """(first Q tile, Q tiles a head): the Q tiles that see a key of the tile starting at start_n; a program
        steps through them for each query head of its group. Packed, none where the tile starts past its sequence's
        keys (the grid covers the longest)."""
        lo = 0
        if self.MASK_RIGHT:
            lo = gl.maximum(start_n - diag, 0) // self.BLOCK_M
        hi = gl.cdiv(seqlen_q, self.BLOCK_M)
        if self.MASK_LEFT:  # the Q tile of the last row whose window starts at the tile's last key or before
            hi = gl.maximum(gl.minimum(hi, gl.maximum(start_n + self.BLOCK_N - 1 - diag_left + self.BLOCK_M, 0)
                                       // self.BLOCK_M), lo)
        if self.IS_VARLEN:
            if start_n >= seqlen_k:
                hi = lo
        return lo, hi - lo

    @gluon.jit
    def row_stats(self, Stats, b, h, offs_m, other, seqlen_q, q_row0):
        """LSE or delta of the rows offs_m of query head h (packed: of the sequence from row q_row0 of the (nheads,
        total) rows); ``other`` past the sequence."""
        base = Stats + b.to(gl.int64) * self.stride_lb + h.to(gl.int64) * self.stride_lh
        if self.IS_VARLEN:
            base += q_row0
        return gl.load(base + offs_m, mask=offs_m < seqlen_q, other=other)


@gluon.jit
def _load_partition(pb: Problem, smem: Smem, q_desc, k_desc, v_desc, do_desc, cu_seqlens_q, cu_seqlens_k):
    """One warp: K and V once, then Q and dO of every (query head, Q tile) in turn."""
    start_n, b, h_k, q_row0, k_row0, seqlen_q, seqlen_k, diag, diag_left = pb.program(cu_seqlens_q, cu_seqlens_k)
    k_row = k_row0 + h_k * pb.views.k_rows_h + start_n
    mbarrier.expect(smem.kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, k_row, h_k * pb.views.k_col_h, smem.kv_bar, smem.k)
    tma_load(v_desc, k_row, h_k * pb.views.k_col_h, smem.kv_bar, smem.v)
    lo, n_m = pb.steps(start_n, seqlen_q, seqlen_k, diag, diag_left)
    for t in range(pb.group * n_m):  # (query head, Q tile); stage t % STAGES in its (t // STAGES)-th round
        h = h_k * pb.group + t // n_m
        row = q_row0 + h * pb.views.q_rows_h + (lo + t % n_m) * pb.BLOCK_M
        stage = t % pb.STAGES
        mbarrier.wait(smem.q_free.index(stage), ((t // pb.STAGES) & 1) ^ 1)
        mbarrier.expect(smem.q_ready.index(stage), q_desc.block_type.nbytes)
        tma_load(q_desc, row, h * pb.views.q_col_h, smem.q_ready.index(stage), smem.q.index(stage))
        mbarrier.expect(smem.do_ready.index(stage), do_desc.block_type.nbytes)
        tma_load(do_desc, row, h * pb.views.q_col_h, smem.do_ready.index(stage), smem.do.index(stage))


@gluon.jit
def _dv_partition(pb: Problem, smem: Smem, dV, stride_b, stride_n, stride_h, cu_seqlens_q, cu_seqlens_k):
    """One warpgroup: Pᵀ of every step, for the dK warpgroup too, and dV += Pᵀ dO."""
    s_layout: gl.constexpr = wgmma_layout(pb.BLOCK_M)
    acc_layout: gl.constexpr = wgmma_layout(pb.HEAD_DIM_PAD)
    start_n, b, h_k, q_row0, k_row0, seqlen_q, seqlen_k, diag, diag_left = pb.program(cu_seqlens_q, cu_seqlens_k)
    last_key = start_n + pb.BLOCK_N - 1
    offs_n = start_n + gl.arange(0, pb.BLOCK_N, layout=gl.SliceLayout(1, s_layout))  # [BLOCK_N] keys
    s_zero = gl.zeros([pb.BLOCK_N, pb.BLOCK_M], gl.float32, layout=s_layout)
    dv = gl.zeros([pb.BLOCK_N, pb.HEAD_DIM_PAD], gl.float32, layout=acc_layout)
    mbarrier.wait(smem.kv_bar, 0)
    lo, n_m = pb.steps(start_n, seqlen_q, seqlen_k, diag, diag_left)
    for t in range(pb.group * n_m):  # (query head, Q tile), in the loader's order
        stage = t % pb.STAGES
        phase = (t // pb.STAGES) & 1
        start_m = (lo + t % n_m) * pb.BLOCK_M
        offs_m = start_m + gl.arange(0, pb.BLOCK_M, layout=gl.SliceLayout(0, s_layout))  # [BLOCK_M] queries
        mbarrier.wait(smem.q_ready.index(stage), phase)
        s_t = warpgroup_mma(smem.k, smem.q.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        # Rows past the query sequence: LSE = +inf, so P = 0 there whatever the neighbour's rows hold.
        lse = pb.row_stats(pb.LSE, b, h_k * pb.group + t // n_m, offs_m, float("inf"), seqlen_q, q_row0) * LOG2E
        s_t = warpgroup_mma_wait(0, deps=(s_t, ))  # [BLOCK_N, BLOCK_M]
        if pb.SOFTCAP_SCALE > 0:
            s_t = tanh(s_t * pb.SOFTCAP_SCALE, True)
        p_t = gl.exp2(s_t * pb.qk_scale - lse[None, :])
        if pb.MASK_RIGHT or pb.MASK_LEFT:
            cut = last_key >= seqlen_k  # the end, the diagonal, the window's start
            if pb.MASK_RIGHT:
                cut = cut | (last_key > start_m + diag)
            if pb.MASK_LEFT:
                cut = cut | (start_n < start_m + pb.BLOCK_M - 1 + diag_left)
            if cut:
                ok = (offs_n < seqlen_k)[:, None]
                if pb.MASK_RIGHT:
                    ok = ok & (offs_n[:, None] <= (offs_m + diag)[None, :])
                if pb.MASK_LEFT:
                    ok = ok & (offs_n[:, None] >= (offs_m + diag_left)[None, :])
                p_t = gl.where(ok, p_t, 0.0)
        elif last_key >= seqlen_k:  # the keys pass the sequence's end
            p_t = gl.where((offs_n < seqlen_k)[:, None], p_t, 0.0)
        p_ds = p_t  # what the dK warpgroup's dSᵀ takes: Pᵀ, times 1 − tanh² where the scores are capped
        if pb.SOFTCAP_SCALE > 0:
            p_ds = p_t * (1.0 - s_t * s_t)
        p_t = p_t.to(smem.q.dtype)
        mbarrier.wait(smem.p_free.index(t % 2), ((t // 2) & 1) ^ 1)
        smem.p.index(t % 2).store(p_ds.to(smem.q.dtype))
        gl.thread_barrier()
        mbarrier.arrive(smem.p_ready.index(t % 2))
        mbarrier.wait(smem.do_ready.index(stage), phase)
        dv = warpgroup_mma(gl.convert_layout(p_t, register_operand_layout(acc_layout)), smem.do.index(stage), dv,
                           is_async=True)
        dv = warpgroup_mma_wait(0, deps=(dv, ))
        mbarrier.arrive(smem.q_free.index(stage))
    k_base = 0  # packed dV, dK: rows of every sequence (their batch strides are 0)
    if pb.IS_VARLEN:
        k_base = k_row0
    store_rows(dv, dV, b, h_k, k_base + start_n, k_base + seqlen_k, stride_b, stride_n, stride_h,
               row_run_layout(pb.HEAD_DIM_PAD), pb.HEAD_DIM)


@gluon.jit
def _dk_partition(pb: Problem, smem: Smem, dK, stride_b, stride_n, stride_h, softmax_scale, cu_seqlens_q,
                  cu_seqlens_k):
    """One warpgroup: dPᵀ = V dOᵀ, dSᵀ from the dV warpgroup's Pᵀ, and dK += dSᵀ Q."""
    s_layout: gl.constexpr = wgmma_layout(pb.BLOCK_M)
    acc_layout: gl.constexpr = wgmma_layout(pb.HEAD_DIM_PAD)
    start_n, b, h_k, q_row0, k_row0, seqlen_q, seqlen_k, diag, diag_left = pb.program(cu_seqlens_q, cu_seqlens_k)
    s_zero = gl.zeros([pb.BLOCK_N, pb.BLOCK_M], gl.float32, layout=s_layout)
    dk = gl.zeros([pb.BLOCK_N, pb.HEAD_DIM_PAD], gl.float32, layout=acc_layout)
    mbarrier.wait(smem.kv_bar, 0)
    lo, n_m = pb.steps(start_n, seqlen_q, seqlen_k, diag, diag_left)
    for t in range(pb.group * n_m):
        stage = t % pb.STAGES
        phase = (t // pb.STAGES) & 1
        offs_m = (lo + t % n_m) * pb.BLOCK_M + gl.arange(0, pb.BLOCK_M, layout=gl.SliceLayout(0, s_layout))
        mbarrier.wait(smem.do_ready.index(stage), phase)
        dp_t = warpgroup_mma(smem.v, smem.do.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        delta = pb.row_stats(pb.Delta, b, h_k * pb.group + t // n_m, offs_m, 0.0, seqlen_q, q_row0)
        dp_t = warpgroup_mma_wait(0, deps=(dp_t, ))  # [BLOCK_N, BLOCK_M]
        mbarrier.wait(smem.p_ready.index(t % 2), (t // 2) & 1)
        p_t = smem.p.index(t % 2).load(s_layout).to(gl.float32)  # [BLOCK_N, BLOCK_M]
        gl.thread_barrier()
        mbarrier.arrive(smem.p_free.index(t % 2))
        ds_t = (p_t * (dp_t - delta[None, :])).to(smem.q.dtype)
        mbarrier.wait(smem.q_ready.index(stage), phase)
        dk = warpgroup_mma(gl.convert_layout(ds_t, register_operand_layout(acc_layout)), smem.q.index(stage), dk,
                           is_async=True)
        dk = warpgroup_mma_wait(0, deps=(dk, ))
        mbarrier.arrive(smem.q_free.index(stage))
    k_base = 0
    if pb.IS_VARLEN:
        k_base = k_row0
    store_rows(dk * softmax_scale, dK, b, h_k, k_base + start_n, k_base + seqlen_k, stride_b, stride_n, stride_h,
               row_run_layout(pb.HEAD_DIM_PAD), pb.HEAD_DIM)


@gluon.jit
def flash_bwd_dkdv_split_kernel(q_desc, k_desc, v_desc, do_desc, dK, dV, LSE, Delta, nheads_k, group, q_rows_b,
                                q_rows_h, q_col_h, k_rows_b, k_rows_h, k_col_h, stride_dkb, stride_dkn, stride_dkh,
                                stride_dvb, stride_dvn, stride_dvh, stride_lb, stride_lh, seqlen_q, seqlen_k, diag,
                                diag_left, qk_scale, softmax_scale, cu_seqlens_q, cu_seqlens_k, HEAD_DIM: gl.constexpr,
                                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                SWITCHES: gl.constexpr, REGS: gl.constexpr):
    """Grid (K/V tiles of BLOCK_N keys, batch · nheads_k). Query i sees keys i + diag_left .. i + diag (SWITCHES, a
    bwd_dq.BwdSwitches: each bound where its side is masked)."""
    HEAD_DIM_PAD: gl.constexpr = tile_cols(HEAD_DIM)
    dtype: gl.constexpr = q_desc.dtype
    bar: gl.constexpr = mbarrier.MBarrierLayout()
    smem = Smem(allocate_tiles(k_desc, None), allocate_tiles(v_desc, None), allocate_tiles(q_desc, STAGES),
                allocate_tiles(do_desc, STAGES),
                gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)),
                gl.allocate_shared_memory(gl.int64, [1], bar), gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar),
                gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar),
                gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar), gl.allocate_shared_memory(gl.int64, [2, 1], bar),
                gl.allocate_shared_memory(gl.int64, [2, 1], bar))
    mbarrier.init(smem.kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(smem.q_ready.index(i), count=1)
        mbarrier.init(smem.do_ready.index(i), count=1)
        mbarrier.init(smem.q_free.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(smem.p_ready.index(i), count=1)
        mbarrier.init(smem.p_free.index(i), count=1)
    pb = Problem(as_tensor(nheads_k), as_tensor(group),
                 views(q_rows_b, q_rows_h, q_col_h, k_rows_b, k_rows_h, k_col_h, seqlen_q, seqlen_k), as_tensor(diag),
                 as_tensor(diag_left), qk_scale, LSE, Delta, as_tensor(stride_lb), as_tensor(stride_lh), HEAD_DIM_PAD,
                 HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, SWITCHES)
    gl.warp_specialize([
        (_dv_partition, (pb, smem, dV, stride_dvb, stride_dvn, stride_dvh, cu_seqlens_q, cu_seqlens_k)),
        (_dk_partition, (pb, smem, dK, stride_dkb, stride_dkn, stride_dkh, softmax_scale, cu_seqlens_q,
                         cu_seqlens_k)),
        (_load_partition, (pb, smem, q_desc, k_desc, v_desc, do_desc, cu_seqlens_q, cu_seqlens_k)),
    ], [4, 1], [REGS, 24])


def launch_args(q, k, v, dout, dk, dv, lse, delta, softmax_scale, window_size, bottom_right, config, softcap=0.0,
                packed=None):
    """(grid, args, kwargs) of the dK/dV launch (calls bwd_hopper.supports accepts); dk, dv shaped like k;
    ``config`` a configs.HopperBwdConfig with split_gradients; ``window_size``: as bwd_dq.band's; ``softcap``:
    flash-attn's (0: none); ``packed``: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of packed (total,
    nheads, headdim) tensors, or None."""
    block_m, block_n = config.block_m, config.block_n
    nheads, nheads_k = q.shape[-2], k.shape[-2]
    descs, q_rows, k_rows = backward_descriptors(q, k, v, dout, block_m, block_n, packed is not None)
    (cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, batch, lse_strides), (mask_right, mask_left, diag, diag_left) = (
        launch_rows(q, k, lse, window_size, bottom_right, packed))
    qk_scale, softcap_scale, _ = score_scales(softmax_scale, softcap)
    grid = (cdiv(seqlen_k, block_n), batch * nheads_k)
    args = (*descs, dk, dv, lse, delta, nheads_k, nheads // nheads_k, *q_rows, *k_rows, *token_strides(dk),
            *token_strides(dv), *lse_strides, seqlen_q, seqlen_k, diag, diag_left, qk_scale, softmax_scale,
            cu_seqlens_q, cu_seqlens_k)
    switches = BwdSwitches(mask_right, mask_left, IS_VARLEN=packed is not None, BOTTOM_RIGHT=bottom_right,
                           SOFTCAP_SCALE=softcap_scale)
    kwargs = dict(HEAD_DIM=q.shape[-1], BLOCK_M=block_m, BLOCK_N=block_n, STAGES=config.num_stages, SWITCHES=switches,
                  REGS=config.consumer_regs, num_warps=4, maxnreg=168)
    return grid, args, kwargs
