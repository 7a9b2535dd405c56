"""Which work items a program of the sm90 forward (kernels/hopper/fwd.py) takes, and the int32 counter its programs
claim items from and queue FROZEN_MAX's failed rows in.

A work item is a BLOCK_M-row Q tile of one head. SCHEDULE 0 and 1 deal pairs of tiles with equal causal work to the
programs (1: light work last), 2 single tiles (non-causal persistent grids), 3 lets each persistent program claim
its next item from the counter as it becomes free (causal, equal lengths). The counter's layout: [0] claims, [1]
codes queued for the rows' redo (kernels/hopper/exact_rows.py), [2] programs done, then the queue from REDO_QUEUE.
"""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..common.replay import stream_handle
from ..common.tiles import cdiv
from .common import sequence_rows

WG_M = gl.constexpr(64)  # Q rows per consumer warpgroup (one m64 wgmma); BLOCK_M // WG_M consumers
REDO_QUEUE = gl.constexpr(3)  # counter: [0] claims, [1] codes queued for the redo, [2] programs done, queue
COUNTERS = {}  # (device, stream) -> the int32 that SCHEDULE 3 launches on that stream claim items from
GRAPH_COUNTERS = []  # those of launches captured in CUDA graphs, one each


@gluon.jit
def n_items(n_m, n_bh, SCHEDULE: gl.constexpr):
    """How many work items this program takes: every grid-th of the n_m·n_bh Q tiles (SCHEDULE 2), or both
    sides of every grid-th of the ⌈n_m / 2⌉·n_bh pairs."""
    if SCHEDULE == 2:
        return gl.cdiv(n_m * n_bh - gl.program_id(0), gl.num_programs(0))
    return 2 * gl.cdiv((n_m + 1) // 2 * n_bh - gl.program_id(0), gl.num_programs(0))


@gluon.jit
def work_item(w, n_m, n_bh, seqlen_q, BLOCK_M: gl.constexpr, SCHEDULE: gl.constexpr):
    """(head of the batch, Q tile) of this program's w-th work item. Pair j of a head holds its Q tiles
    n_m − 1 − j and j, so under a causal mask every pair costs the same (n_m + 1 K/V tiles); the pairs (or
    tiles) of a head are neighbours, so programs running at once share its K and V in L2. With SCHEDULE ≥ 1
    the light work comes after all the rest, so the last round evens out the programs: a ragged last tile
    (whose idle warpgroups skip it; SCHEDULE 2, non-causal: single tiles) and the one-tile middle pair. Packed
    sequences are ordered by the longest one's tiles."""
    rem = seqlen_q % BLOCK_M  # 0 < rem <= BLOCK_M - WG_M: the last Q tile leaves a warpgroup idle (Nq = 1: ints)
    ragged = (rem + BLOCK_M - 1) // BLOCK_M - (rem + WG_M - 1) // BLOCK_M
    if SCHEDULE == 2:
        item = gl.program_id(0) + w * gl.num_programs(0)
        n_whole = n_m - ragged
        bh = item // gl.maximum(n_whole, 1)
        m = item % gl.maximum(n_whole, 1)
        if item >= n_bh * n_whole:
            bh = item - n_bh * n_whole
            m = n_m - 1
    else:
        pair = gl.program_id(0) + w // 2 * gl.num_programs(0)
        side = w % 2
        n_half = (n_m + 1) // 2
        if SCHEDULE == 1:
            n_light = gl.minimum(ragged + n_m % 2, n_half)  # pairs j = 0 (ragged) and n_half - 1 (n_m odd)
            n_heavy = n_half - n_light
            bh = pair // gl.maximum(n_heavy, 1)
            j = pair % gl.maximum(n_heavy, 1) + ragged
            if pair >= n_bh * n_heavy:
                bh = (pair - n_bh * n_heavy) // n_light
                j = ((pair - n_bh * n_heavy) % n_light + 1 - ragged) * (n_half - 1)
        else:
            bh = pair // n_half
            j = pair % n_half
        m = j + (1 - side) * (n_m - 1 - 2 * j) + side * (2 * j == n_m - 1).to(gl.int32) * (n_m - j)
    return bh, m


@gluon.jit
def tile_at(bh, m, nheads, group, cu_seqlens_q, cu_seqlens_k, q_rows_b, q_rows_h, k_rows_b, k_rows_h, seqlen_q,
             seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
             IS_VARLEN: gl.constexpr):
    """Q tile m of head bh (of the batch): the tile's first
    row (past the sequence for the second side of an odd middle pair), batch, head, both sequences' first rows
    and lengths in the 2-D views, the causal offset, the K/V tiles it visits and how many of them are whole."""
    start_m = m * BLOCK_M
    b = bh // nheads
    h = bh % nheads
    q_row, k_row, seqlen_q, seqlen_k = sequence_rows(b, b * q_rows_b + h * q_rows_h,
                                                     b * k_rows_b + (h // group) * k_rows_h, seqlen_q, seqlen_k,
                                                     cu_seqlens_q, cu_seqlens_k, IS_VARLEN)
    diag = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    hi = seqlen_k
    full_hi = seqlen_k
    if CAUSAL:
        hi = gl.minimum(hi, start_m + BLOCK_M + diag)
        full_hi = gl.minimum(full_hi, start_m + 1 + diag)
    n_tiles = gl.maximum(gl.cdiv(hi, BLOCK_N), 1)  # a row band that sees no key still runs one masked tile
    n_full = gl.maximum(full_hi, 0) // BLOCK_N
    return start_m, b, h, q_row, k_row, seqlen_q, seqlen_k, diag, n_tiles, n_full


@gluon.jit
def window_item(start_m, k_row, seqlen_k, diag, diag_left, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                MASK_RIGHT: gl.constexpr):
    """A sliding window's item, rows start_m .. start_m + BLOCK_M - 1, where query i sees keys i + diag_left to
    i + diag (to the end without MASK_RIGHT): the item moved to its first visible K/V tile, lo. Returns (k_row,
    seqlen_k, diag, diag_left) counted from that tile's first key, the K/V tiles to visit (at least one, masked where
    the rows see nothing) and the first and past-the-last tiles that need no mask (relative to lo)."""
    hi = seqlen_k
    full_hi = seqlen_k
    if MASK_RIGHT:
        hi = gl.minimum(hi, start_m + BLOCK_M + diag)
        full_hi = gl.minimum(full_hi, start_m + 1 + diag)
    n_hi = gl.maximum(gl.cdiv(gl.maximum(hi, 0), BLOCK_N), 1)
    lo = gl.minimum(gl.maximum(start_m + diag_left, 0) // BLOCK_N, n_hi - 1)  # the first row's first key's tile
    full_lo = gl.cdiv(gl.maximum(start_m + BLOCK_M - 1 + diag_left, 0), BLOCK_N)  # the last row's
    n_full = gl.maximum(full_hi, 0) // BLOCK_N
    shift = lo * BLOCK_N
    return (k_row + shift, seqlen_k - shift, diag - shift, diag_left - shift, n_hi - lo, full_lo - lo,
            n_full - lo)


@gluon.jit
def lpt_item(i, side, n_m, n_bh, tail_heads):
    """SCHEDULE 3 (causal, one program per SM): (head, Q tile, whether a second tile follows) of side 0 or 1 of
    the i-th item of one order that the programs claim from a counter as each becomes free. The items are pairs of
    Q tiles (n_m − 1 − j, j) in head order, then the last tail_heads heads' tiles one at a time, heaviest first:
    the last claims are small, and the programs finish together."""
    n_half = (n_m + 1) // 2
    n_pairs = (n_bh - tail_heads) * n_half
    t = gl.maximum(i - n_pairs, 0)
    bh = n_bh - tail_heads + t % tail_heads
    m = n_m - 1 - t // tail_heads
    two = i < 0
    if i < n_pairs:
        bh = i // n_half
        j = i % n_half
        m = j + (1 - side) * (n_m - 1 - 2 * j)
        two = (side == 0) & (2 * j != n_m - 1)
    return bh, m, two


@triton.constexpr_function
def one_lane():
    return gl.BlockedLayout([1], [32], [4], [0])


@gluon.jit
def counter_op(counter, index, value, XCHG: gl.constexpr = False):
    """One atomic on counter[index] for the whole warpgroup (acquire-release, GPU scope): its old value."""
    lane = gl.arange(0, 128, layout=one_lane())
    ptrs = counter + index + lane * 0
    if XCHG:
        old = gl.atomic_xchg(ptrs, value + lane * 0, mask=lane == 0)
    else:
        old = gl.atomic_add(ptrs, value + lane * 0, mask=lane == 0)
    return gl.max(gl.where(lane == 0, old, 0), axis=0)


def uses_claims(config, causal, varlen, seqlen_q):
    """Whether the launch takes SCHEDULE 3: causal, one program per SM, equal-length sequences (with packed ones
    the host does not know each tile's work), two Q tiles or more (with one, the compiler folds a consumer's rows
    past the sequence, and spills)."""
    return (config.claims > 0 and causal and not varlen and config.persistent and config.block_m < seqlen_q
            <= config.persistent_max_seqlen)


def uses_frozen_max(config, dtype, windowed=False):
    """Whether the launch takes FROZEN_MAX: bf16 only (P may grow far past fp16's range); under a sliding window only
    with two consumer warpgroups (three, at 160 registers each, spill the window's running-maximum tiles)."""
    return config.frozen_max and dtype == torch.bfloat16 and (not windowed or config.block_m <= 2 * WG_M.value)


def counter_size(config, causal, q, cu_seqlens_q, max_seqlen_q, windowed=False):
    """How many int32 the launch's counter needs (0: none): the claims counter (SCHEDULE 3), and with FROZEN_MAX
    the queue of redo, a place for every (head, Q tile, consumer warpgroup)."""
    varlen = cu_seqlens_q is not None
    batch, seqlen_q = (cu_seqlens_q.numel() - 1, max_seqlen_q) if varlen else (q.shape[0], q.shape[1])
    if uses_frozen_max(config, q.dtype, windowed):
        return REDO_QUEUE.value + batch * q.shape[-2] * cdiv(seqlen_q, config.block_m) * (config.block_m // WG_M.value)
    return 1 if uses_claims(config, causal, varlen, seqlen_q) else 0


def is_stream_counter(device, counter):
    """Whether ``counter`` is the one stream_counter would hand a launch on the current stream now (never while a CUDA
    graph is captured: each captured launch gets its own)."""
    if torch.cuda.is_current_stream_capturing():
        return False
    return COUNTERS.get((device, stream_handle(device))) is counter


def stream_counter(device, size):
    """The zeroed int32 counter (at least ``size`` of them) a launch claims items from and queues FROZEN_MAX's
    failed rows in. Eager: one per stream, made on its first launch, grown when a launch needs more (each launch's
    last claim, and its last consumer, set their counts back to 0, so the launches of a stream, in order, each start
    from 0). While a CUDA graph is captured: one of the graph's own, zeroed in the graph before the kernel, so that
    graphs replayed at once on different streams do not share one."""
    if torch.cuda.is_current_stream_capturing():
        GRAPH_COUNTERS.append(torch.zeros(size, dtype=torch.int32, device=device))  # alive while any graph may be
        return GRAPH_COUNTERS[-1]
    key = (device, stream_handle(device))
    if key not in COUNTERS or COUNTERS[key].numel() < size:
        if len(COUNTERS) >= 64:  # streams made and dropped call after call (a replay keeps its own counter alive)
            COUNTERS.clear()
        COUNTERS[key] = torch.zeros(size, dtype=torch.int32, device=device)
    return COUNTERS[key]
