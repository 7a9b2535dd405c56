"""FlashAttention forward for Hopper (sm90), warp-specialized, in Gluon.

A work item is a BLOCK_M-row (128 or 192) Q tile of one head; a program takes a pair of them (a heavy and a light one
under a causal mask), or (persistent) one program per SM walks pairs p, p + grid, ... (non-causal: single tiles);
either way the next item's loads overlap this one's tail. Light items (a last tile cut short enough that a consumer
has no row in it, which that consumer skips; a head's one-tile middle pair) come after all the rest. With claims
(D=64 causal), a persistent program takes its next item from a global counter when it becomes free,
the last items being single tiles, heaviest first, so that the programs finish together. A loader warp
streams each item's Q and the K and V tiles its rows may see through a ring of shared-memory stages with TMA, each
stage guarded by mbarriers (K ready, V ready, K free once every Q·Kᵀ read it, V free once every P·V did). Two
consumer warpgroups (three with 192-row tiles, as D=64 takes), 64 rows each, run the matrix products as
asynchronous wgmma and the online softmax in registers (240 registers each with two, 160 with three; the loader
keeps 24). Each step a consumer issues Q·Kᵀ of tile j with P·V of tile j-1, then runs the softmax of tile j; the
consumers take turns at the tensor cores (ping-pong, in a ring; a config switch, off at D=256), so that one's
softmax runs under the others' products. O leaves in 16-byte runs of a row, not in the wgmma layout's
4-byte pieces: D=64 converts through triton's scratch, D=128 (no shared memory to spare) through its rows of the
item's last K tile (STAGE_K: a barrier waits for every consumer's last Q·Kᵀ, and that K is freed after the epilogue);
with two K/V stages D=128 has room for an O tile per consumer instead, which a TMA store reads while the next item
runs (STAGE_O, where O's rows map as Q's). D=128 turns P to 16 bits at the end of each step (EARLY_P; D=256 too), so
that its fp32 copy is not alive beside the next scores, and from 2k rows keeps Q in registers as Q·Kᵀ's A operand
(Q_REGS): shared memory then feeds only K and V to the tensor cores, and the loader may refill a consumer's Q tile at
the start of the item. Each thread keeps its own share of the row sums of P (_lane_sums), which the four lanes holding
a row add once per item, not every step.

FROZEN_MAX (bf16): every K/V tile after an item's first is exponentiated against a reference kept per row, not
against the tile's own row maxima, so a step has no row maximum, no rescaling of O and no correction of l; P may
exceed 1, which floating point carries exactly until something overflows. The reference starts at the first tile's
row maxima; at an item's second tile and every eighth after, rows whose sum has reached 2^-32 move it up by
⌊log2 l⌋ + 48 and scale O and l by that power of two (_rebase), so that a row's sum sits near 2^-48 with room to grow
and scores that rise along the keys cost what random ones do. Only a score more than about 150 log2 units above
everything before it overflows float32: a warpgroup whose O or row sums are then not finite
stores nothing and queues its rows in ``counter``; once every program is done, the launch's last one recomputes
them exactly (kernels/hopper/exact_rows.py).

A sliding window (MASK_LEFT) makes an item start at the K/V tile that holds its first row's first key and
masks the tiles that cross either side of the band. A row's first tile may then hold none of its keys, so with
FROZEN_MAX a warpgroup keeps the running maximum up to the tile where its last row meets its first key
(_window_step), and freezes from there.

Tensors are read through 2-D descriptors over (rows, row stride) views: a head's rows of one sequence
are ``row_base + n`` at column ``col``. Rows past a sequence belong to its neighbour (or are zero-filled
at the end of the tensor); scores of keys past the sequence are masked, and O rows past it are not
stored.
"""
import triton.profiler.language as pl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..common.online_softmax import LN2, LOG2E, fold_sink, online_softmax_step, tanh
from .common import (
    allocate_tiles,
    as_tensor,
    register_operand_layout,
    row_run_layout,
    tile_cols,
    tile_mask,
    tma_load,
    tma_store,
    views,
    wgmma_layout,
)
from .exact_rows import out_offsets, push_redo, redo
from .fwd_bundles import Outputs, Problem, Ring, Switches
from .fwd_schedule import WG_M, lpt_item, n_items

HEADROOM = gl.constexpr(48)  # FROZEN_MAX: a rebased row's sum is about 2^-HEADROOM (P's room to grow)
REBASE_AT = gl.constexpr(2.0**-32)  # FROZEN_MAX: a row sum at this moves the row's reference up ...
REBASE_EVERY = gl.constexpr(8)  # ... at an item's 2nd K/V tile and every REBASE_EVERY-th after, and at its end


@gluon.jit
def _claimed(code_smem, q_bar, wg: gl.constexpr, done):
    """SCHEDULE 3: the code (bh · n_m + m, or -1: no more) of this consumer's next Q tile, which the loader writes
    beside its Q rows."""
    mbarrier.wait(q_bar.index(wg), done & 1)
    return gl.max(code_smem.index(wg).load(gl.BlockedLayout([1], [32], [4], [0])), axis=0)


@gluon.jit
def _load_tile(sw, pb, desc, free, ready, bufs, g, j, k_row, h, SCOPE: gl.constexpr):
    """K or V of the item's tile j (the launch's g-th) into ring stage g % STAGES of ``bufs`` once every consumer freed
    it (timeline scopes "wait stage free" and ``SCOPE``)."""
    stage = g % sw.STAGES
    with pl.scope("wait stage free"):
        mbarrier.wait(free.index(stage), ((g // sw.STAGES) & 1) ^ 1)
    with pl.scope(SCOPE):
        mbarrier.expect(ready.index(stage), desc.block_type.nbytes)
        tma_load(desc, k_row + j * sw.BLOCK_N, (h // pb.group) * pb.views.k_col_h, ready.index(stage),
                 bufs.index(stage))


@gluon.jit
def _load_item(sw, ring, pb, q_desc, k_desc, v_desc, code, counter, claim, claimed, n_work, g, done, start_m, h,
               q_row, k_row, n_tiles):
    """One item: each consumer's Q rows once that consumer freed the previous ones (SCHEDULE 3: with the tile's
    code), then K and V of each tile into the next ring stage, each once every consumer freed its own. With
    ``claim``, the next item's number is claimed from ``counter`` after the first tile's loads, where the loader
    would wait for a free stage anyway (the atomic's round trip at the start of an item would delay its loads);
    returns (g, claimed)."""
    for i in gl.static_range(sw.BLOCK_M // WG_M):
        with pl.scope("wait Q free"):  # pl scopes: timeline records under Proton's instrumentation, else nothing
            mbarrier.wait(ring.q_free.index(i), (done & 1) ^ 1)
        with pl.scope("load Q"):
            if sw.SCHEDULE == 3:
                ring.code.index(i).store(gl.full([1], code, gl.int32, gl.BlockedLayout([1], [32], [1], [0])))
            mbarrier.expect(ring.q_bar.index(i), q_desc.block_type.nbytes)
            tma_load(q_desc, q_row + start_m + i * WG_M, h * pb.views.q_col_h, ring.q_bar.index(i), ring.q.index(i))
    for j in range(n_tiles):
        _load_tile(sw, pb, k_desc, ring.k_free, ring.k_ready, ring.k, g, j, k_row, h, "load K")
        _load_tile(sw, pb, v_desc, ring.v_free, ring.v_ready, ring.v, g, j, k_row, h, "load V")
        g += 1
        if sw.SCHEDULE == 3:
            if claim and j == 0:
                claimed = gl.atomic_add(counter, 1)
                if claimed == n_work - 1:  # the launch's last claim: the next launch counts from 0 again
                    gl.atomic_xchg(counter, 0)
    return g, claimed


@gluon.jit
def _load_partition(sw, ring, pb, q_desc, k_desc, v_desc, counter, tail_heads, cu_seqlens_q, cu_seqlens_k):
    """One warp: each of this program's work items in turn (_load_item). SCHEDULE 3 claims the next item from
    ``counter`` during each item's first side, and ends by handing each consumer the code -1."""
    g = 0  # K/V tiles loaded so far: stage g % STAGES, in its (g // STAGES)-th round
    done = 0
    if sw.SCHEDULE == 3:
        n_work = (pb.n_bh - tail_heads) * ((pb.n_m + 1) // 2) + tail_heads * pb.n_m
        i = gl.program_id(0)
        side = 0
        claimed = 0
        while i < n_work:
            bh, m, two = lpt_item(i, side, pb.n_m, pb.n_bh, tail_heads)
            start_m, b, h, q_row, k_row, sq, sk, diag, diag_left, n_tiles, full_lo, n_full = pb.tile(
                sw, bh, m, cu_seqlens_q, cu_seqlens_k)
            g, claimed = _load_item(sw, ring, pb, q_desc, k_desc, v_desc, bh * pb.n_m + m, counter, side == 0,
                                    claimed, n_work, g, done, start_m, h, q_row, k_row, n_tiles)
            done += 1
            if two:
                side = 1
            else:
                side = 0
                i = claimed + gl.num_programs(0)
        for s in gl.static_range(sw.BLOCK_M // WG_M):
            mbarrier.wait(ring.q_free.index(s), (done & 1) ^ 1)
            ring.code.index(s).store(gl.full([1], -1, gl.int32, gl.BlockedLayout([1], [32], [1], [0])))
            mbarrier.arrive(ring.q_bar.index(s))
    else:
        for w in range(n_items(pb.n_m, pb.n_bh, sw.SCHEDULE)):  # this program's items
            start_m, b, h, q_row, k_row, sq, sk, diag, diag_left, n_tiles, full_lo, n_full = pb.item(
                sw, w, cu_seqlens_q, cu_seqlens_k)
            if start_m < sq:
                g, _ = _load_item(sw, ring, pb, q_desc, k_desc, v_desc, 0, counter, False, 0, 0, g, done, start_m, h,
                                  q_row, k_row, n_tiles)
                done += 1


@gluon.jit
def _scores(s, j, full_lo, n_full, offs_m, seqlen_k, diag, diag_left, sw, s_layout: gl.constexpr):
    """Tile j's scores (softcapped: tanh(q·k · SOFTCAP_SCALE)), with keys past the sequence, past the diagonal
    (MASK_RIGHT) and before a window's start (MASK_LEFT) at -inf: only in tiles outside [full_lo, n_full)."""
    if sw.SOFTCAP_SCALE > 0:
        s = tanh(s * sw.SOFTCAP_SCALE, True)
    masked = j >= n_full
    if sw.MASK_LEFT:
        masked = masked | (j < full_lo)
    if masked:
        offs_n = j * sw.BLOCK_N + gl.arange(0, sw.BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        if sw.MASK_RIGHT:  # one compare per score, against each row's last visible key
            ok = offs_n[None, :] <= gl.minimum(offs_m + diag, seqlen_k - 1)[:, None]
        else:
            ok = offs_n[None, :] < seqlen_k
        if sw.MASK_LEFT:
            ok = ok & (offs_n[None, :] >= (offs_m + diag_left)[:, None])
        s = gl.where(ok, s, float("-inf"))
    return s


@gluon.jit
def _lane_sums(l_i, alpha, p, BLOCK_N: gl.constexpr):
    """The running row sums rescaled by alpha plus P's, each thread keeping its own share, [WG_M, 4] (the four lanes
    of a quad hold a row's columns 2q, 2q+1 of every 8): summed across the quad once per item."""
    out = gl.sum(gl.sum(gl.reshape(p, [WG_M, BLOCK_N // 8, 4, 2]), axis=3), axis=1)  # [WG_M, 4]
    if l_i is not None and alpha is None:
        out = l_i + out
    elif l_i is not None:
        out = l_i * gl.convert_layout(alpha, gl.SliceLayout(1, out.type.layout), assert_trivial=True)[:, None] + out
    return out


@gluon.jit
def _rebase(m_ref, l_i):
    """FROZEN_MAX: rows whose running sum reached REBASE_AT take a reference ⌊log2 l⌋ + HEADROOM higher (l from a
    quad's largest share), so that later tiles' P stays far from float32's range whatever the scores do.
    Returns the new reference, l and the factor alpha (a power of two, 1 where nothing moved) that O takes."""
    l_row = gl.convert_layout(gl.max(l_i, axis=1), m_ref.type.layout, assert_trivial=True)
    e = gl.where(l_row >= REBASE_AT, gl.minimum((l_row.to(gl.int32, bitcast=True) >> 23) - 127 + HEADROOM, 126),
                 0)  # [WG_M]
    alpha = ((127 - e) << 23).to(gl.float32, bitcast=True)  # 2^-e
    shift = e.to(gl.float32)
    l_i = l_i * gl.convert_layout(alpha, gl.SliceLayout(1, l_i.type.layout), assert_trivial=True)[:, None]
    return m_ref + shift, l_i, alpha


@gluon.jit
def _window_step(scores, j, j0, m_i, m_ref, l_i, qk_scale, sw):
    """FROZEN_MAX under a window (MASK_LEFT), tile j of an item: up to tile j0 the running maximum, as an item's first
    tile takes it (a row of the warpgroup may meet its first key there), then the frozen reference, moved up at j0 + 1
    and every REBASE_EVERY-th tile after. Returns P, alpha (what O takes), m_i, the reference and l."""
    if j <= j0:
        p, alpha, m_i, _ = online_softmax_step(m_i, 0.0, scores, qk_scale, sw.MAY_BE_EMPTY)
        l_i = _lane_sums(l_i, alpha, p, sw.BLOCK_N)
        m_ref = gl.where(m_i == float("-inf"), 0.0, m_i)
    else:
        alpha = gl.full_like(m_ref, 1.0)
        if (j - j0) % REBASE_EVERY == 1:
            m_ref, l_i, alpha = _rebase(m_ref, l_i)
        p = gl.exp2(scores * qk_scale - m_ref[:, None])  # [WG_M, BLOCK_N]
        l_i = _lane_sums(l_i, None, p, sw.BLOCK_N)
    return p, alpha, m_i, m_ref, l_i


@gluon.jit
def _operand(p, p_layout: gl.constexpr, dtype: gl.constexpr, CONVERT: gl.constexpr):
    """P as the 16-bit A operand of P·V, in registers (with CONVERT; else P already is)."""
    if CONVERT:
        p = gl.convert_layout(p.to(dtype), p_layout)
    return p


@gluon.jit
def _take_turn(turn, wg: gl.constexpr, i, PINGPONG: gl.constexpr):
    """Ping-pong: warpgroup ``wg`` issues its i-th batch of products only after the warpgroup before it (in a
    ring) issued its own (fresh mbarriers count as having completed the phase before 0, so warpgroup 0
    starts)."""
    if PINGPONG:
        mbarrier.wait(turn.index(wg), (i & 1) ^ (wg == 0))


@gluon.jit
def _pass_turn(turn, wg: gl.constexpr, NUM_WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index((wg + 1) % NUM_WG))


@gluon.jit
def _pass_tiles(k_ready, v_ready, k_free, v_free, turn, wg: gl.constexpr, g, turns, lo, hi, STAGES: gl.constexpr,
                NUM_WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Tiles lo to hi - 1 of an item, past this warpgroup's rows: keep the ring of turns, free each stage."""
    for j in range(lo, hi):
        stage = (g + j) % STAGES
        mbarrier.wait(k_ready.index(stage), ((g + j) // STAGES) & 1)  # this round's stage
        mbarrier.wait(v_ready.index(stage), ((g + j) // STAGES) & 1)
        _take_turn(turn, wg, turns + j + 1, PINGPONG)
        _pass_turn(turn, wg, NUM_WG, PINGPONG)
        mbarrier.arrive(k_free.index(stage))
        mbarrier.arrive(v_free.index(stage))


@gluon.jit
def _consume_item(wg: gl.constexpr, sw, ring, pb, outs, o_desc, start_m, b, h, q_row, sq, sk, diag, diag_left, n_tiles,
                  full_lo, n_full, g, turns, done):
    """_consumer's work on one item (Problem.tile's): g K/V tiles and ``turns`` batches of products came before it,
    ``done`` items.
    Returns 1 where FROZEN_MAX's reference failed these rows (nothing of them stored), else 0."""
    NUM_WG: gl.constexpr = sw.BLOCK_M // WG_M
    s_layout: gl.constexpr = wgmma_layout(sw.BLOCK_N)
    o_layout: gl.constexpr = wgmma_layout(sw.HEAD_DIM_PAD)
    p_layout: gl.constexpr = register_operand_layout(o_layout)
    store_layout: gl.constexpr = row_run_layout(sw.HEAD_DIM_PAD)
    dtype: gl.constexpr = ring.q.dtype
    q_wg = ring.q.index(wg)
    s_zero = gl.zeros([WG_M, sw.BLOCK_N], gl.float32, layout=s_layout)
    bad = gl.to_tensor(0)  # FROZEN_MAX: 1 where these rows are left to redo
    if start_m + wg * WG_M >= sq:  # rows all past the sequence: no products, no stores
        mbarrier.wait(ring.q_bar.index(wg), done & 1)
        mbarrier.arrive(ring.q_free.index(wg))
        if sw.STAGE_K:
            mbarrier.arrive(ring.k_done.index(0))
        _take_turn(ring.turn, wg, turns, sw.PINGPONG)
        _pass_turn(ring.turn, wg, NUM_WG, sw.PINGPONG)
        _pass_tiles(ring.k_ready, ring.v_ready, ring.k_free, ring.v_free, ring.turn, wg, g, turns, 0, n_tiles,
                    sw.STAGES, NUM_WG, sw.PINGPONG)
        if sw.STAGE_K:  # as an epilogue does: no arrival for the next item before this item's phase is done
            mbarrier.wait(ring.k_done.index(0), done & 1)
    else:
        offs_m = start_m + wg * WG_M + gl.arange(0, WG_M, layout=gl.SliceLayout(1, s_layout))
        m_i = gl.full([WG_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([WG_M, sw.HEAD_DIM_PAD], gl.float32, layout=o_layout)

        n_own = n_tiles
        if sw.MASK_RIGHT and not sw.MASK_LEFT and NUM_WG > 2:  # 192-row tiles: the first warpgroups' rows end
            # a 128-key tile or earlier (a window's items run whole: the scalars would spill)
            first = start_m + wg * WG_M
            n_own = gl.maximum(gl.cdiv(gl.minimum(sk, first + WG_M + diag), sw.BLOCK_N), 1)
            n_full = gl.maximum(gl.minimum(sk, first + 1 + diag), 0) // sw.BLOCK_N
        with pl.scope("wait Q"):
            mbarrier.wait(ring.q_bar.index(wg), done & 1)
        if sw.Q_REGS:  # Q·Kᵀ reads Q from registers: the loader may fetch the next item's rows now
            q_op = q_wg.load(register_operand_layout(s_layout))
            fence_async_shared()  # these reads are ordered before the loader's TMA write of the next rows
            mbarrier.arrive(ring.q_free.index(wg))
        else:
            q_op = q_wg
        with pl.scope("wait K/V"):
            mbarrier.wait(ring.k_ready.index(g % sw.STAGES), (g // sw.STAGES) & 1)
        with pl.scope("wait turn"):
            _take_turn(ring.turn, wg, turns, sw.PINGPONG)
        with pl.scope("issue MMA"):
            s = warpgroup_mma(q_op, ring.k.index(g % sw.STAGES).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        _pass_turn(ring.turn, wg, NUM_WG, sw.PINGPONG)
        with pl.scope("wait QK"):
            s = warpgroup_mma_wait(0, deps=(s, ))  # [WG_M, BLOCK_N]
        if n_own == 1:
            if not sw.Q_REGS:
                mbarrier.arrive(ring.q_free.index(wg))
            if sw.STAGE_K:
                mbarrier.arrive(ring.k_done.index(0))
        if not sw.STAGE_K or n_own > 1:  # K read (STAGE_K: O goes through the item's last K tile)
            mbarrier.arrive(ring.k_free.index(g % sw.STAGES))
        with pl.scope("softmax"):
            p, alpha, m_i, _ = online_softmax_step(m_i, 0.0, _scores(s, 0, full_lo, n_full, offs_m, sk, diag, diag_left,
                                                                     sw, s_layout), outs.qk_scale, sw.MAY_BE_EMPTY)
            l_i = _lane_sums(None, alpha, p, sw.BLOCK_N)  # the step's own l (unused) is left to dead code
        m_ref = gl.where(m_i == float("-inf"), 0.0, m_i)  # FROZEN_MAX: every later tile's reference
        alpha = gl.full_like(m_ref, 1.0)  # FROZEN_MAX: what the last _rebase scaled by
        j0 = 0  # FROZEN_MAX: the last tile that keeps the running maximum
        if sw.FROZEN_MAX and sw.MASK_LEFT:  # a window: the tile where this warpgroup's last row meets its first key
            j0 = gl.minimum(gl.maximum(start_m + wg * WG_M + WG_M - 1 + diag_left, 0) // sw.BLOCK_N, n_own - 1)
        p = _operand(p, p_layout, dtype, sw.EARLY_P)
        for j in range(1, n_own):
            stage = (g + j) % sw.STAGES
            prev = (g + j - 1) % sw.STAGES
            with pl.scope("wait K/V"):
                mbarrier.wait(ring.k_ready.index(stage), ((g + j) // sw.STAGES) & 1)
                mbarrier.wait(ring.v_ready.index(prev), ((g + j - 1) // sw.STAGES) & 1)
            with pl.scope("wait turn"):
                _take_turn(ring.turn, wg, turns + j, sw.PINGPONG)
            with pl.scope("issue MMA"):
                s = warpgroup_mma(q_op, ring.k.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
                p_op = _operand(p, p_layout, dtype, not sw.EARLY_P)
                acc = warpgroup_mma(p_op, ring.v.index(prev), acc, is_async=True)
            _pass_turn(ring.turn, wg, NUM_WG, sw.PINGPONG)
            # Nothing stays in flight across the loop edge: ptxas would serialize every wgmma (C7514).
            with pl.scope("wait QK"):
                if sw.OVERLAP_PV:  # this softmax runs while P·V of the previous tile is still on the tensor cores
                    s = warpgroup_mma_wait(1, deps=(s, ))
                else:
                    s, acc = warpgroup_mma_wait(0, deps=(s, acc))
            if not sw.OVERLAP_PV:
                mbarrier.arrive(ring.v_free.index(prev))
            if j == n_own - 1:
                if not sw.Q_REGS:
                    mbarrier.arrive(ring.q_free.index(wg))
                if sw.STAGE_K:
                    mbarrier.arrive(ring.k_done.index(0))
            if not sw.STAGE_K or j < n_own - 1:
                mbarrier.arrive(ring.k_free.index(stage))
            with pl.scope("softmax"):
                if sw.FROZEN_MAX and sw.MASK_LEFT:
                    p, alpha, m_i, m_ref, l_i = _window_step(
                        _scores(s, j, full_lo, n_full, offs_m, sk, diag, diag_left, sw, s_layout), j, j0, m_i, m_ref,
                        l_i, outs.qk_scale, sw)
                elif sw.FROZEN_MAX:
                    if j % REBASE_EVERY == 1:
                        m_ref, l_i, alpha = _rebase(m_ref, l_i)
                    p = gl.exp2(_scores(s, j, full_lo, n_full, offs_m, sk, diag, diag_left, sw, s_layout)
                                * outs.qk_scale - m_ref[:, None])  # [WG_M, BLOCK_N]
                    l_i = _lane_sums(l_i, None, p, sw.BLOCK_N)
                else:
                    scores = _scores(s, j, full_lo, n_full, offs_m, sk, diag, diag_left, sw, s_layout)
                    p, alpha, m_i, _ = online_softmax_step(m_i, 0.0, scores, outs.qk_scale, sw.MAY_BE_EMPTY)
                    l_i = _lane_sums(l_i, alpha, p, sw.BLOCK_N)
            if sw.OVERLAP_PV:
                with pl.scope("wait PV"):
                    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
                mbarrier.arrive(ring.v_free.index(prev))
            p = _operand(p, p_layout, dtype, sw.EARLY_P)  # with P·V done, its operand's registers are free
            if not sw.FROZEN_MAX:
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            elif sw.MASK_LEFT:
                if (j <= j0) | ((j - j0) % REBASE_EVERY == 1):
                    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            elif j % REBASE_EVERY == 1:  # O up to tile j - 1 joins its rows' new reference
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        last = (g + n_own - 1) % sw.STAGES
        with pl.scope("wait K/V"):
            mbarrier.wait(ring.v_ready.index(last), ((g + n_own - 1) // sw.STAGES) & 1)
        with pl.scope("wait turn"):
            _take_turn(ring.turn, wg, turns + n_own, sw.PINGPONG)
        with pl.scope("issue MMA"):
            acc = warpgroup_mma(_operand(p, p_layout, dtype, not sw.EARLY_P), ring.v.index(last), acc,
                                is_async=True)
        _pass_turn(ring.turn, wg, NUM_WG, sw.PINGPONG)
        with pl.scope("wait PV"):
            acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(ring.v_free.index(last))
        if sw.FROZEN_MAX:  # the last tiles' sums, moved back under REBASE_AT with the rest
            m_ref, l_i, alpha = _rebase(m_ref, l_i)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        _pass_tiles(ring.k_ready, ring.v_ready, ring.k_free, ring.v_free, ring.turn, wg, g, turns, n_own, n_tiles,
                    sw.STAGES, NUM_WG,
                    sw.PINGPONG)

        pl.enter_scope("epilogue")
        o_offset, lse_offset = out_offsets(b, h, q_row, outs.stride_ob, outs.stride_on, outs.stride_oh, outs.stride_lb,
                                            outs.stride_lh, sw.IS_VARLEN)
        l_i = gl.convert_layout(gl.sum(l_i, axis=1), gl.SliceLayout(1, s_layout))
        held = True
        lse_kept = offs_m < sq
        if sw.FROZEN_MAX:  # the reference held unless a row sum or O is not finite (l < 2^18 after _rebase)
            m_i = m_ref
            ok = l_i < float("inf")
            acc_ok = gl.min(gl.where(gl.abs(acc) < float("inf"), 1, 0), axis=1)  # [WG_M]
            ok = ok & (gl.convert_layout(acc_ok, gl.SliceLayout(1, s_layout)) > 0)
            bad = gl.max(gl.where(ok | (offs_m >= sq), 0, 1), axis=0)
            held = bad == 0
            lse_kept = lse_kept & held
        if sw.HAS_SINK:  # the head's sink logit joins the denominator
            alpha, m_i, l_i = fold_sink(m_i, l_i, gl.load(outs.Sinks + h) * LOG2E)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        empty = l_i == 0.0  # a row with nothing to attend to: O = 0, LSE = -inf
        lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
        gl.store(outs.LSE + lse_offset + offs_m, lse, mask=lse_kept)
        inv_l = gl.convert_layout(1.0 / gl.where(empty, 1.0, l_i), gl.SliceLayout(1, o_layout))
        out = (acc * inv_l[:, None]).to(dtype)
        if sw.HEAD_DIM_PAD <= 64:  # 16-byte runs of a row per store (O stored from the wgmma layout: 4-byte pieces)
            out = gl.convert_layout(out, store_layout)
        elif sw.STAGE_K:  # the same runs, through this warpgroup's rows of the item's last K tile
            mbarrier.wait(ring.k_done.index(0), done & 1)  # every consumer's last Q·Kᵀ has read that tile
            o_tile = ring.k.index(last).slice(wg * WG_M, WG_M)
            o_tile.store(out)
            out = o_tile.load(store_layout)
            fence_async_shared()  # these writes land before the loader's next TMA load into the tile
        rows = start_m + wg * WG_M + gl.arange(0, WG_M, layout=gl.SliceLayout(1, out.type.layout))
        cols = gl.arange(0, sw.HEAD_DIM_PAD, layout=gl.SliceLayout(0, out.type.layout))
        ptrs = outs.O + o_offset + rows.to(gl.int64)[:, None] * outs.stride_on + cols[None, :]
        rows_kept = rows < sq
        if sw.FROZEN_MAX:
            rows_kept = rows_kept & held
        if sw.STAGE_O and start_m + (wg + 1) * WG_M <= sq and held:
            o_wg = ring.o.index(wg)
            tma.store_wait(0)  # the previous item's O has left this tile
            o_wg.store(out)
            fence_async_shared()
            tma_store(o_desc, q_row + start_m + wg * WG_M, h * pb.views.q_col_h, o_wg)
        else:
            gl.store(ptrs, out, mask=tile_mask(rows_kept, cols, sw.HEAD_DIM))
        if sw.STAGE_K:
            mbarrier.arrive(ring.k_free.index(last))
        pl.exit_scope("epilogue")
    return bad


@gluon.jit
def _consumer(wg: gl.constexpr, sw, ring, pb, outs, o_desc, counter, cu_seqlens_q, cu_seqlens_k):
    """One warpgroup, WG_M of each work item's rows: the online softmax over every K/V tile, then O and LSE.
    Each step issues Q·Kᵀ of tile j and P·V of tile j - 1 together, then runs the softmax of tile j while
    (ping-pong) the other warpgroups' products occupy the tensor cores, and with OVERLAP_PV while its own P·V
    runs. Its Q rows are handed back to the loader as soon as the last Q·Kᵀ is done. With FROZEN_MAX, rows whose
    frozen reference failed are queued for redo."""
    NUM_WG: gl.constexpr = sw.BLOCK_M // WG_M
    g = 0  # K/V tiles consumed so far (the loader's count)
    turns = 0  # batches of products issued so far (ping-pong)
    done = 0
    if sw.SCHEDULE == 3:  # items claimed as programs become free: the loader passes each tile's code
        code = _claimed(ring.code, ring.q_bar, wg, done)
        while code >= 0:
            start_m, b, h, q_row, k_row, sq, sk, diag, diag_left, n_tiles, full_lo, n_full = pb.tile(
                sw, code // pb.n_m, code % pb.n_m, cu_seqlens_q, cu_seqlens_k)
            bad = _consume_item(wg, sw, ring, pb, outs, o_desc, start_m, b, h, q_row, sq, sk, diag, diag_left,
                                n_tiles, full_lo, n_full, g, turns, done)
            if sw.FROZEN_MAX:
                if bad > 0:
                    push_redo(counter, (code * NUM_WG + wg))
            g += n_tiles
            turns += n_tiles + 1
            done += 1
            code = _claimed(ring.code, ring.q_bar, wg, done)
    else:
        for w in range(n_items(pb.n_m, pb.n_bh, sw.SCHEDULE)):  # this program's items
            start_m, b, h, q_row, k_row, sq, sk, diag, diag_left, n_tiles, full_lo, n_full = pb.item(
                sw, w, cu_seqlens_q, cu_seqlens_k)
            if start_m < sq:
                bad = _consume_item(wg, sw, ring, pb, outs, o_desc, start_m, b, h, q_row, sq, sk, diag, diag_left,
                                    n_tiles, full_lo, n_full, g, turns, done)
                if sw.FROZEN_MAX:
                    if bad > 0:
                        push_redo(counter, ((b * pb.nheads + h) * pb.n_m + start_m // sw.BLOCK_M) * NUM_WG + wg)
                g += n_tiles
                turns += n_tiles + 1
                done += 1
    if sw.STAGE_O:
        tma.store_wait(0)  # the tiles outlive no store that reads them


@gluon.jit
def flash_fwd_hopper_kernel(q_desc, k_desc, v_desc, o_desc, O, LSE, Sinks, Qp, Kp, Vp, q_width, k_width, v_width,
                            cu_seqlens_q, cu_seqlens_k, counter, tail_heads, q_rows_b, q_rows_h, q_col_h, k_rows_b,
                            k_rows_h, k_col_h, stride_ob, stride_on, stride_oh,
                            stride_lb, stride_lh, seqlen_q, seqlen_k, nheads, group, n_m, n_bh, qk_scale, right, left,
                            HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, SWITCHES: gl.constexpr):
    """1-D grid over the n_m Q tiles (SCHEDULE 2) or ⌈n_m / 2⌉ pairs of them of each of the n_bh = batch x
    nheads heads (see work_item): program p takes work p, p + grid, ... (SCHEDULE 3: item p, then those it claims from
    ``counter``, see lpt_item) (with a persistent grid the loader fetches
    the next item's tiles during this one's tail). A head's rows of sequence b start at row b·rows_b + h·rows_h
    (batch) or cu_seqlens[b] (varlen) of its 2-D view, at column h·col_h. A K/V tile holds k_desc's rows. SWITCHES: a
    FwdSwitches (with HAS_SINK, Sinks holds each head's sink logit; else it is LSE, unread). With MASK_LEFT (a
    sliding window) query i sees keys i + diag - left .. i + diag + right, and an item starts at the K/V tile of its
    first row's first key (fwd_schedule.window_item); else right and left are unused."""
    HEAD_DIM_PAD: gl.constexpr = tile_cols(HEAD_DIM)
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    sw = Switches(HEAD_DIM_PAD, HEAD_DIM, BLOCK_M, BLOCK_N, SWITCHES)
    NUM_WG: gl.constexpr = BLOCK_M // WG_M
    q_smem = allocate_tiles(q_desc, NUM_WG)
    k_smem = allocate_tiles(k_desc, sw.STAGES)
    v_smem = allocate_tiles(v_desc, sw.STAGES)
    o_smem = q_smem  # (unused without STAGE_O)
    if sw.STAGE_O:  # each consumer's O tile, which a TMA store reads while the next item runs
        o_smem = allocate_tiles(o_desc, NUM_WG)
    q_bar = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [sw.STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [sw.STAGES, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [sw.STAGES, 1], mbarrier.MBarrierLayout())  # every Q·Kᵀ read K
    v_free = gl.allocate_shared_memory(gl.int64, [sw.STAGES, 1], mbarrier.MBarrierLayout())  # every P·V read V
    turn = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    k_done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    code_smem = q_bar  # (unused below SCHEDULE 3)
    if sw.SCHEDULE == 3:  # each consumer's next Q tile, as the loader claimed it
        code_smem = gl.allocate_shared_memory(gl.int32, [NUM_WG, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    # unused barriers stay uninitialized: triton may reuse their bytes as scratch, undefined for an mbarrier
    if sw.STAGE_K:
        mbarrier.init(k_done.index(0), count=NUM_WG)
    for i in gl.static_range(NUM_WG):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(q_free.index(i), count=1)
        if sw.PINGPONG:
            mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(sw.STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=NUM_WG)
        mbarrier.init(v_free.index(i), count=NUM_WG)

    ring = Ring(q_smem, k_smem, v_smem, o_smem, q_bar, q_free, k_ready, v_ready, k_free, v_free, code_smem, k_done,
                turn)
    pb = Problem(views(q_rows_b, q_rows_h, q_col_h, k_rows_b, k_rows_h, k_col_h, seqlen_q, seqlen_k), as_tensor(nheads),
                 as_tensor(group), as_tensor(n_m), as_tensor(n_bh), as_tensor(right), as_tensor(left))
    outs = Outputs(O, LSE, Sinks, as_tensor(stride_ob), as_tensor(stride_on), as_tensor(stride_oh),
                   as_tensor(stride_lb), as_tensor(stride_lh), qk_scale)
    # a batch-mode cu_seqlens (None) cannot sit in an aggregate: each partition takes the two beside it
    if NUM_WG == 3:  # a third consumer warpgroup: 192 Q rows share each K/V tile (D=64's registers allow it)
        gl.warp_specialize([
            (_consumer, (0, sw, ring, pb, outs, o_desc, counter, cu_seqlens_q, cu_seqlens_k)),
            (_consumer, (1, sw, ring, pb, outs, o_desc, counter, cu_seqlens_q, cu_seqlens_k)),
            (_consumer, (2, sw, ring, pb, outs, o_desc, counter, cu_seqlens_q, cu_seqlens_k)),
            (_load_partition, (sw, ring, pb, q_desc, k_desc, v_desc, counter, tail_heads, cu_seqlens_q,
                               cu_seqlens_k)),
        ], [4, 4, 1], [sw.REGS, sw.REGS, 24])
    else:
        gl.warp_specialize([
            (_consumer, (0, sw, ring, pb, outs, o_desc, counter, cu_seqlens_q, cu_seqlens_k)),
            (_consumer, (1, sw, ring, pb, outs, o_desc, counter, cu_seqlens_q, cu_seqlens_k)),
            (_load_partition, (sw, ring, pb, q_desc, k_desc, v_desc, counter, tail_heads, cu_seqlens_q,
                               cu_seqlens_k)),
        ], [4, 1], [sw.REGS, 24])
    if sw.FROZEN_MAX:  # (after the partitions joined)
        redo(counter, sw, pb, outs, Qp, Kp, Vp, q_width, k_width, v_width, cu_seqlens_q, cu_seqlens_k)
