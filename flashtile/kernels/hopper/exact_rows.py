"""The Hopper forward's way back when a frozen reference fails (kernels/hopper/fwd.py, FROZEN_MAX).

With FROZEN_MAX each K/V tile after an item's first is exponentiated against a reference that moves up only
every few tiles, so P may exceed 1. That is exact in floating point as long as nothing overflows; O or a row sum
that is not finite (a score some 150 log2 units above everything before it, or inf / NaN in the inputs) sends the
warpgroup's 64 rows here:
the plain online softmax (online_softmax_step, each tile's own maxima), with pointer loads and mma.sync from
global memory. It runs rarely, so it is written to be read, not to be fast.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from ..common.online_softmax import LN2, LOG2E, fold_sink, online_softmax_step, tanh
from .common import tile_mask
from .fwd_schedule import REDO_QUEUE, WG_M, counter_op


@gluon.jit
def exact_rows(Q, K, V, O, LSE, q_width, k_width, v_width, q_row, q_col, k_row, k_col, first, sq, sk, diag, diag_left,
               o_offset, lse_offset, stride_on, qk_scale, sink, sw):
    """O and LSE of query rows first .. first + 63 of one head: Q's at rows q_row + first .. of the Q view
    (q_width elements a row) from column q_col, the keys' at rows k_row .. of the K and V views from column
    k_col (HEAD_DIM columns each, in tiles of HEAD_DIM_PAD); O at o_offset + row · stride_on, LSE at lse_offset + row.
    Query i sees keys up to i + diag (MASK_RIGHT) and from i + diag_left (MASK_LEFT). HAS_SINK: ``sink`` (log2 units)
    joins the denominator. ``sw``: the launch's fwd_bundles.Switches."""
    HEAD_DIM_PAD: gl.constexpr = sw.HEAD_DIM_PAD
    HEAD_DIM: gl.constexpr = sw.HEAD_DIM
    BLOCK_N: gl.constexpr = 16
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # 16 bytes a load
    rows: gl.constexpr = gl.BlockedLayout([1, 8], [256 // HEAD_DIM_PAD, HEAD_DIM_PAD // 8], [4, 1], [1, 0])
    dtype: gl.constexpr = Q.dtype.element_ty

    offs_m = first + gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    cols = gl.arange(0, HEAD_DIM_PAD, layout=gl.SliceLayout(0, rows))
    rows_q = first + gl.arange(0, 64, layout=gl.SliceLayout(1, rows))
    m_i = gl.full([64], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma))
    l_i = gl.zeros([64], gl.float32, layout=gl.SliceLayout(1, mma))
    acc = gl.zeros([64, HEAD_DIM_PAD], gl.float32, layout=mma)
    hi = sk
    if sw.MASK_RIGHT:
        hi = gl.minimum(hi, first + 64 + diag)
    for start in range(0, hi, BLOCK_N):  # (Q read again each tile: registers are few beside the consumer's state)
        q = gl.load(Q + (q_row + rows_q).to(gl.int64)[:, None] * q_width + q_col + cols[None, :],
                    mask=tile_mask(rows_q < sq, cols, HEAD_DIM), other=0.0)  # [64, HEAD_DIM_PAD]
        q = gl.convert_layout(q, a_op)
        keys = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, rows))
        k = gl.load(K + (k_row + keys).to(gl.int64)[:, None] * k_width + k_col + cols[None, :],
                    mask=tile_mask(keys < sk, cols, HEAD_DIM), other=0.0)  # [BLOCK_N, HEAD_DIM_PAD]
        s = mma_v2(q, gl.convert_layout(gl.permute(k, (1, 0)), b_op), gl.zeros([64, BLOCK_N], gl.float32, layout=mma))
        if sw.SOFTCAP_SCALE > 0:
            s = tanh(s * sw.SOFTCAP_SCALE, True)
        offs_n = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        ok = offs_n[None, :] < sk
        if sw.MASK_RIGHT:
            ok = ok & (offs_n[None, :] <= offs_m[:, None] + diag)
        if sw.MASK_LEFT:
            ok = ok & (offs_n[None, :] >= offs_m[:, None] + diag_left)
        p, alpha, m_i, l_i = online_softmax_step(m_i, l_i, gl.where(ok, s, float("-inf")), qk_scale, sw.MAY_BE_EMPTY)
        v = gl.load(V + (k_row + keys).to(gl.int64)[:, None] * v_width + k_col + cols[None, :],
                    mask=tile_mask(keys < sk, cols, HEAD_DIM), other=0.0)  # [BLOCK_N, HEAD_DIM_PAD]
        acc = mma_v2(gl.convert_layout(p.to(dtype), a_op), gl.convert_layout(v, b_op), acc * alpha[:, None])

    if sw.HAS_SINK:
        alpha, m_i, l_i = fold_sink(m_i, l_i, sink)
        acc = acc * alpha[:, None]
    empty = l_i == 0.0  # a row with nothing to attend to: O = 0, LSE = -inf
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
    gl.store(LSE + lse_offset + offs_m, lse, mask=offs_m < sq)
    out = (acc * (1.0 / gl.where(empty, 1.0, l_i))[:, None]).to(dtype)
    cols = gl.arange(0, HEAD_DIM_PAD, layout=gl.SliceLayout(0, mma))
    gl.store(O + o_offset + offs_m.to(gl.int64)[:, None] * stride_on + cols[None, :], out,
             mask=tile_mask(offs_m < sq, cols, HEAD_DIM))


@gluon.jit
def out_offsets(b, h, q_row, stride_ob, stride_on, stride_oh, stride_lb, stride_lh, IS_VARLEN: gl.constexpr):
    """Where a head's rows of sequence b start in O and in LSE."""
    o_offset = b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
    lse_offset = b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh
    if IS_VARLEN:
        o_offset = q_row.to(gl.int64) * stride_on + h.to(gl.int64) * stride_oh
        lse_offset = h.to(gl.int64) * stride_lh + q_row
    return o_offset, lse_offset


@gluon.jit
def push_redo(counter, code):
    """FROZEN_MAX: queue one warpgroup's rows of a work item (code = (head · n_m + Q tile) · NUM_WG + warpgroup) for
    redo. counter[1] counts the queued codes, which start at counter[REDO_QUEUE]."""
    slot = counter_op(counter, 1, 1)
    counter_op(counter, REDO_QUEUE + slot, code, XCHG=True)


@gluon.jit
def redo(counter, sw, pb, outs, Qp, Kp, Vp, q_width, k_width, v_width, cu_seqlens_q, cu_seqlens_k):
    """FROZEN_MAX, once a program's partitions are done: counter[2] counts the programs, and the launch's last one
    (every queued code is in by then) computes the queued rows exactly (exact_rows), then sets the counts back to 0
    for the stream's next launch. ``sw``, ``pb``, ``outs``: the launch's fwd_bundles.Switches, Problem and Outputs.
    Qp, Kp, Vp are the 2-D views (columns of a head: col_h · HEAD_DIM where the descriptors' views are 3-D,
    common.head_coord)."""
    COL: gl.constexpr = sw.HEAD_DIM if sw.HEAD_DIM < sw.HEAD_DIM_PAD else 1
    NUM_WG: gl.constexpr = sw.BLOCK_M // WG_M
    if counter_op(counter, 2, 1) == gl.num_programs(0) - 1:
        n_redo = counter_op(counter, 1, 0)  # (not in range(): its bound is emitted twice)
        for i in range(n_redo):
            code = counter_op(counter, REDO_QUEUE + i, 0)
            tile = code // NUM_WG
            start_m, b, h, q_row, k_row, sq, sk, diag, diag_left, n_tiles, full_lo, n_full = pb.tile(
                sw, tile // pb.n_m, tile % pb.n_m, cu_seqlens_q, cu_seqlens_k)
            o_offset, lse_offset = out_offsets(b, h, q_row, outs.stride_ob, outs.stride_on, outs.stride_oh,
                                                outs.stride_lb, outs.stride_lh, sw.IS_VARLEN)
            sink = 0.0
            if sw.HAS_SINK:
                sink = gl.load(outs.Sinks + h) * LOG2E
            exact_rows(Qp, Kp, Vp, outs.O, outs.LSE, q_width, k_width, v_width, q_row, h * pb.views.q_col_h * COL,
                       k_row, (h // pb.group) * pb.views.k_col_h * COL, start_m + code % NUM_WG * WG_M, sq, sk, diag,
                       diag_left, o_offset, lse_offset, outs.stride_on, outs.qk_scale, sink, sw)
        counter_op(counter, 1, 0, XCHG=True)  # the counts back to 0 for the stream's next launch
        counter_op(counter, 2, 0, XCHG=True)
