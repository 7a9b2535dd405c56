"""Flash decoding: split the KV cache into chunks, attend to each chunk in its own program, merge the
partial results exactly by their log-sum-exp.

``flash_decode_split_kernel``: a program owns (chunk, batch, KV head) and reads its slice of the cache
once for every query head of the group and every new query token: those rows are packed together as
the M dimension (GQA packing), row r = token (r // group), head h_k·group + (r % group); where a key's KV heads
sit side by side in memory a program may read several adjacent KV heads a tile (``DecodeConfig.heads``). It writes a
float32 partial O (normalized within the chunk) and the chunk's LSE; the last chunk of a row tile to
finish merges them (``merge_rows``: O = Σ_s exp(lse_s − lse) O_s with lse = log Σ_s exp(lse_s), −inf
partials weigh 0), so a decode step is one launch. ``combine_kernel`` runs the same merge over partials
users bring (``flashtile.combine``).

The cache is contiguous (batch, seqlen, nheads_k, headdim), rows picked through ``cache_batch_idx`` (else
row b), or paged (num_pages, page_size, nheads_k, headdim) through ``block_table``: key j of sequence b
lives in page block_table[b, j // page_size] at offset j % page_size. Where BLOCK_N divides the page size, a tile
lies inside one page and comes as one TMA box, as in a contiguous cache (a window's or a cache_leftpad's first tile
starts at a tile edge, the keys before masked); else its rows are gathered by pointers.
"""
import triton
import triton.language as tl

from ..common.online_softmax import (
    LN2,
    LOG2E,
    alibi_slope,
    modified_scores,
    online_softmax_step,
    score_scales,
    softcap_mode,
)
from ..common.replay import Replay, Replays, aligned, detach_descriptor
from ..common.tiles import band_mask, cdiv, host_descriptors, next_pow2, tma_addressable


@triton.jit
def flash_decode_split_kernel(
    Q, K, V, Part, Out, LSE, arrivals, cache_seqlens, block_table, batch_idx, cache_leftpad, Alibi,
    q_strides, kv_strides, part_strides, out_strides, sizes, paging, scales, band,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, USE_TMA: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,
    SPLIT: tl.constexpr, BLOCK_S: tl.constexpr, MERGE_ROWS: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
    HAS_LEFTPAD: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, WRITE_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, KEY_GROUPS: tl.constexpr, HEADS: tl.constexpr,
):
    """Grid (splits, batch · nheads_k, row tiles). With SPLIT, each program writes its chunk's partial O and
    LSE to Part (float32: the O of every split, then their LSE from lse_part_start on), and the last split of
    a (batch, KV head, row tile) to arrive merges them into Out and LSE; without, the single split writes Out
    and LSE itself; LSE only with WRITE_LSE. Each key tile is split in KEY_GROUPS groups, each with its own running
    max, sum and O, merged once at the end: with one group per warp, no step needs another warp's scores. With
    HEADS > 1 a program reads HEADS adjacent KV heads as one box a tile (in a key-major cache, one run of
    HEADS · 256 bytes a key), each head's query rows with a state of its own (the groups are then the heads). With
    SOFTCAP the scores are tanh(q·k · softcap_scale), and qk_scale carries the cap (flash-attn's softcap:
    cap · tanh(scale · q·k / cap)). With HAS_ALIBI each score gets −slope · |i + diag − j| (query i, key j), in
    units of the logit (alibi_unit = 1 / (cap or scale)). Every index read from memory is clamped into its tensor
    (lengths to the ``capacity`` keys a sequence's cache holds, rows and pages to the cache's ``cache_rows``): no
    value of cache_seqlens, cache_leftpad, cache_batch_idx or block_table makes it read outside them.
    Bundles: q_strides (batch, token, head), kv_strides (K's, then V's: page or batch, token, head), part_strides
    (Part's O: split, batch, token, head; its LSE: split, batch, head; where its LSE starts), out_strides (Out: batch,
    token, head; LSE: batch, head), sizes (seqlen_q, seqlen_new, nheads_k, chunk, capacity), paging (page_size,
    cache_rows, block_table's row stride), scales (qk_scale, softcap_scale, alibi_unit, Alibi's batch stride), band
    (left, right)."""
    stride_qb, stride_qt, stride_qh = q_strides
    stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh = kv_strides
    stride_os, stride_ob, stride_ot, stride_oh, stride_ls, stride_lb, stride_lh, lse_part_start = part_strides
    stride_out_b, stride_out_t, stride_out_h, stride_lse_b, stride_lse_h = out_strides
    seqlen_q, seqlen_new, nheads_k, chunk, capacity = sizes
    page_size, cache_rows, stride_bt = paging
    qk_scale, softcap_scale, alibi_unit, stride_alibi_b = scales
    left, right = band
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // (nheads_k // HEADS)).to(tl.int64)
    h_k = (pid_bh % (nheads_k // HEADS) * HEADS).to(tl.int64)  # the program's (first) KV head
    seqlen_k = tl.minimum(tl.maximum(tl.load(cache_seqlens + b), 0) + seqlen_new, capacity)  # the old keys, the new
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    token = rows // GROUP  # [BLOCK_M]
    head = h_k * GROUP + rows % GROUP  # [BLOCK_M]
    if HEADS > 1:
        head = (h_k + tl.arange(0, HEADS))[:, None] * GROUP + (rows % GROUP)[None, :]  # [HEADS, BLOCK_M]
    row_ok = token < seqlen_q
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    ok = tl.expand_dims(row_ok, -1) & d_ok  # [BLOCK_M, HEAD_DIM]
    q = tl.load(Q + b * stride_qb + tl.expand_dims(token, -1) * stride_qt + tl.expand_dims(head, -1) * stride_qh
                + offs_d, mask=ok, other=0.0)  # [BLOCK_M, HEAD_DIM] (or [HEADS, BLOCK_M, HEAD_DIM])

    diag = seqlen_k - seqlen_q  # new tokens sit at the end of the cache: bottom-right alignment
    start = split * chunk
    end = tl.minimum(start + chunk, seqlen_k)
    if MASK_RIGHT:  # keys past the last token of this tile's band are never loaded
        last_token = tl.minimum(seqlen_q - 1, (tl.program_id(2) * BLOCK_M + BLOCK_M - 1) // GROUP)
        end = tl.minimum(end, last_token + diag + right + 1)
    if MASK_LEFT:
        start = tl.maximum(start, tl.program_id(2) * BLOCK_M // GROUP + diag - left)
    pad = 0
    if HAS_LEFTPAD:  # the sequence's keys start at cache_leftpad[b]: the slots before it are padding
        pad = tl.minimum(tl.maximum(tl.load(cache_leftpad + b), 0), seqlen_k)
        start = tl.maximum(start, pad)
    MASK_PAD: tl.constexpr = PAGED and USE_TMA and HAS_LEFTPAD
    # whole tiles keep each inside a page; the masks drop the keys left of the window or of the pad
    if PAGED and USE_TMA and (MASK_LEFT or HAS_LEFTPAD):
        start = start // BLOCK_N * BLOCK_N
    cache_row = b  # the contiguous cache's row of this sequence (unused when PAGED)
    if HAS_BATCH_IDX and not PAGED:
        cache_row = tl.minimum(tl.maximum(tl.load(batch_idx + b), 0), cache_rows - 1).to(tl.int64)
    slopes = alibi_slope(Alibi, b, stride_alibi_b, head, alibi_unit, HAS_ALIBI, row_ok)  # as head
    GROUPS: tl.constexpr = KEY_GROUPS * HEADS  # the states: one per key group, or per head
    m_i = tl.full([GROUPS, BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUPS, BLOCK_M], tl.float32)
    acc = tl.zeros([GROUPS, BLOCK_M, HEAD_DIM_PAD], tl.float32)
    q = tl.broadcast_to(q[None, :, :] if HEADS == 1 else q, [GROUPS, BLOCK_M, HEAD_DIM_PAD])
    offs_n = tl.arange(0, BLOCK_N)
    page = tl.zeros([BLOCK_N], tl.int64) + (0 if PAGED else cache_row)  # a contiguous cache's row of each key
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N  # the tiles before it end before `end`
    first_end = start
    if MASK_PAD:  # the tile that holds the pad's edge is masked; the whole tiles after it are not
        first_end = tl.minimum(start + BLOCK_N, full_end)
    cache = (block_table, page_size, cache_rows, stride_bt)
    k_strides, v_strides = (stride_kp, stride_kt, stride_kh), (stride_vp, stride_vt, stride_vh)
    mods = (diag, left, right, slopes, softcap_scale, qk_scale)  # the scores' modifiers and band
    for step in tl.static_range(3):  # the pad's tile, the whole tiles, then the tile that crosses `end`, if any
        if step == 0:
            lo, hi = start, first_end
        elif step == 1:
            lo, hi = first_end, full_end
        else:
            lo, hi = full_end, end
        if step > 0 or MASK_PAD:
            for start_n in tl.range(lo, hi, BLOCK_N):
                acc, m_i, l_i = attend_tile(
                    acc, m_i, l_i, q, K, V, b, cache_row, page, h_k, start_n, end, pad, cache, k_strides, v_strides,
                    offs_n, offs_d, d_ok, token, mods, BLOCK_N, HEAD_DIM_PAD, KEY_GROUPS, PAGED, USE_TMA,
                    MASK_PAD and step != 1, DOT_PRECISION, step == 2, HEADS, MASK_LEFT, MASK_RIGHT, SOFTCAP,
                    HAS_ALIBI)

    if HEADS == 1:
        m_i, l_i, acc = merge_groups(m_i, l_i, acc)  # [BLOCK_M], [BLOCK_M], [BLOCK_M, HEAD_DIM]
    empty = l_i == 0.0
    acc = acc * tl.expand_dims(1.0 / tl.where(empty, 1.0, l_i), -1)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)  # as head
    if SPLIT:
        O_part, LSE_part = Part, Part + lse_part_start
        split = split.to(tl.int64)
        o_rows = b * stride_ob + token * stride_ot + head * stride_oh
        l_rows = b * stride_lb + head * stride_lh + token
        tl.store(O_part + split * stride_os + tl.expand_dims(o_rows, -1) + offs_d, acc, mask=ok)
        tl.store(LSE_part + split * stride_ls + l_rows, lse, mask=row_ok)
        tl.debug_barrier()  # every thread's partial is written before the release below
        tile = pid_bh * tl.num_programs(2) + tl.program_id(2)
        if tl.atomic_add(arrivals + tile, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
            tl.store(arrivals + tile, 0)  # zero again for the next call
            first = tl.program_id(2) * BLOCK_M
            n_rows = tl.minimum(BLOCK_M, GROUP * seqlen_q - first)
            for g in tl.static_range(HEADS):
                for r0 in range(0, n_rows, MERGE_ROWS):
                    r = r0 + tl.arange(0, MERGE_ROWS)
                    t = (first + r) // GROUP
                    hq = (h_k + g) * GROUP + (first + r) % GROUP
                    merge_rows(O_part, LSE_part, Out, LSE, b * stride_ob + t * stride_ot + hq * stride_oh,
                               b * stride_lb + hq * stride_lh + t,
                               b * stride_out_b + t * stride_out_t + hq * stride_out_h,
                               b * stride_lse_b + hq * stride_lse_h + t, r < n_rows, tl.num_programs(0), stride_os,
                               stride_ls, HEAD_DIM, HEAD_DIM_PAD, BLOCK_S, WRITE_LSE)
    else:
        out_rows = b * stride_out_b + token * stride_out_t + head * stride_out_h  # as head
        tl.store(Out + tl.expand_dims(out_rows, -1) + offs_d, acc.to(Out.dtype.element_ty), mask=ok)
        if WRITE_LSE:
            tl.store(LSE + b * stride_lse_b + head * stride_lse_h + token, lse, mask=row_ok)


@triton.jit
def attend_tile(acc, m_i, l_i, q, K, V, b, cache_row, page, h_k, start_n, end, pad, cache, k_strides, v_strides,
                offs_n, offs_d, d_ok, token, mods, BLOCK_N: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                KEY_GROUPS: tl.constexpr, PAGED: tl.constexpr, USE_TMA: tl.constexpr, MASK_PAD: tl.constexpr,
                DOT_PRECISION: tl.constexpr, LAST: tl.constexpr, HEADS: tl.constexpr, MASK_LEFT: tl.constexpr,
                MASK_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """One step over the keys [start_n, start_n + BLOCK_N), in KEY_GROUPS groups of consecutive keys, or of each of
    the HEADS KV heads from h_k on (q, m_i, l_i and acc carry the groups first): scores, the online softmax, P·V into
    acc. Only the LAST tile (the one that crosses ``end``) masks the keys from ``end`` on and zeroes their V rows (with
    TMA they are real cache memory, maybe never written); every other tile's V goes from shared memory straight to the
    tensor cores. With MASK_PAD (a left-padded paged cache read as boxes: the first and the last tile) the tile also
    drops the keys before ``pad`` and zeroes their V rows. The bundles: ``cache`` (block_table, page_size,
    cache_rows, stride_bt), the caches' (page, token, head) strides and ``mods`` (diag, left, right, slopes,
    softcap_scale, qk_scale)."""
    block_table, page_size, cache_rows, stride_bt = cache
    stride_kp, stride_kt, stride_kh = k_strides
    stride_vp, stride_vt, stride_vh = v_strides
    diag, left, right, slopes, softcap_scale, qk_scale = mods
    GROUP_N: tl.constexpr = BLOCK_N // KEY_GROUPS
    keys = start_n + offs_n  # [BLOCK_N]
    row, slot = cache_row, start_n
    if USE_TMA and PAGED:  # the tile lies inside one page (BLOCK_N divides page_size)
        row = tl.minimum(tl.maximum(tl.load(block_table + b * stride_bt + start_n // page_size), 0),
                         cache_rows - 1).to(tl.int64)
        slot = start_n % page_size
    if USE_TMA:
        k = tma_tile(K, row, h_k, slot, HEADS, BLOCK_N, HEAD_DIM_PAD)
    else:
        k = cache_tile(K, block_table, b, page, keys, end, page_size, cache_rows, stride_bt, stride_kp, stride_kt,
                       stride_kh, h_k, offs_d, d_ok, PAGED, LAST)
    k = tl.permute(k.reshape(q.shape[0], GROUP_N, HEAD_DIM_PAD), (0, 2, 1))  # [GROUPS, HEAD_DIM, GROUP_N]
    zeros = tl.zeros([q.shape[0], q.shape[1], GROUP_N], tl.float32)
    qk = group_dot(q, k, zeros, DOT_PRECISION)  # [GROUPS, BLOCK_M, GROUP_N]
    if HAS_ALIBI:
        dist = tl.abs((token + diag)[:, None] - keys[None, :]).to(tl.float32)  # [BLOCK_M, BLOCK_N]
        dist = tl.permute(dist.reshape(token.shape[0], KEY_GROUPS, GROUP_N), (1, 0, 2))
        qk, _ = modified_scores(qk, softcap_scale, tl.expand_dims(slopes, -1), dist, SOFTCAP, HAS_ALIBI)
    else:
        qk, _ = modified_scores(qk, softcap_scale, 0.0, 0.0, SOFTCAP, HAS_ALIBI)
    if LAST or MASK_LEFT or MASK_RIGHT or MASK_PAD:
        ok = band_mask(token, keys, end, diag, left, right, MASK_LEFT, MASK_RIGHT)
        if MASK_PAD:
            ok = ok & (keys >= pad)[None, :]
        ok = tl.broadcast_to(ok, [token.shape[0], BLOCK_N])
        qk = tl.where(tl.permute(ok.reshape(token.shape[0], KEY_GROUPS, GROUP_N), (1, 0, 2)), qk, float("-inf"))
    p, alpha, m_i, l_i = online_softmax_step(m_i, l_i, qk, qk_scale, True, AXIS=2)
    if USE_TMA:
        v = tma_tile(V, row, h_k, slot, HEADS, BLOCK_N, HEAD_DIM_PAD)
        if LAST:
            v = tl.where((keys < end)[:, None] & d_ok[None, :], v, 0.0)
        if MASK_PAD:
            v = tl.where((keys >= pad)[:, None], v, 0.0)
    else:
        v = cache_tile(V, block_table, b, page, keys, end, page_size, cache_rows, stride_bt, stride_vp, stride_vt,
                       stride_vh, h_k, offs_d, d_ok, PAGED, LAST)
    acc = acc * alpha[:, :, None]
    acc = group_dot(p.to(v.dtype), v.reshape(q.shape[0], GROUP_N, HEAD_DIM_PAD), acc, DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def tma_tile(X, cache_row, h_k, start_n, HEADS: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """Keys [start_n, start_n + BLOCK_N) of KV head h_k ([BLOCK_N, HEAD_DIM]; host-built 4-D descriptors over the
    contiguous cache, pipelined by the compiler), or of the HEADS heads from h_k on ([HEADS, BLOCK_N, HEAD_DIM]: boxes
    over the (batch, nheads_k, seqlen, headdim) view)."""
    if HEADS > 1:
        x = X.load([cache_row.to(tl.int32), h_k.to(tl.int32), start_n, 0]).reshape(HEADS, BLOCK_N, HEAD_DIM_PAD)
    else:
        x = X.load([cache_row.to(tl.int32), start_n, h_k.to(tl.int32), 0]).reshape(BLOCK_N, HEAD_DIM_PAD)
    return x


@triton.jit
def group_dot(a, b, acc, DOT_PRECISION: tl.constexpr):
    """acc + a·b per key group, a [G, M, K], b [G, K, N]; one group as a 2-D dot (a batched dot of one lays every
    warp over the same rows)."""
    if a.shape[0] == 1:
        return tl.dot(a.reshape(a.shape[1], a.shape[2]), b.reshape(b.shape[1], b.shape[2]),
                      acc.reshape(acc.shape[1], acc.shape[2]), input_precision=DOT_PRECISION).reshape(acc.shape)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def merge_groups(m_i, l_i, acc):
    """The key groups' statistics m_i, l_i [KEY_GROUPS, BLOCK_M] and unnormalized O [KEY_GROUPS, BLOCK_M, D] as one
    set over all their keys: each group rescaled to the largest max (an empty group, max −inf, weighs 0)."""
    m = tl.max(m_i, 0)  # [BLOCK_M]
    w = tl.math.exp2(m_i - tl.where(m == float("-inf"), 0.0, m)[None, :])  # [KEY_GROUPS, BLOCK_M]
    return m, tl.sum(l_i * w, 0), tl.sum(acc * w[:, :, None], 0)


@triton.jit
def cache_tile(X, block_table, b, page, keys, end, page_size, cache_rows, stride_bt, stride_xp, stride_xt, stride_xh,
               h_k, offs_d, d_ok, PAGED: tl.constexpr, MASKED: tl.constexpr):
    """The cache rows ``keys`` [BLOCK_N] of KV head h_k by pointers (0 from ``end`` on when MASKED): through the page
    table when PAGED, else rows of the cache row ``page`` [BLOCK_N] (one value)."""
    ok = keys < end if MASKED else keys >= 0
    if PAGED:
        page = tl.load(block_table + b * stride_bt + keys // page_size, mask=ok, other=0)
        page = tl.minimum(tl.maximum(page, 0), cache_rows - 1).to(tl.int64)
        slot = (keys % page_size).to(tl.int64)
    else:
        slot = keys.to(tl.int64)
    return tl.load(X + page[:, None] * stride_xp + slot[:, None] * stride_xt + h_k * stride_xh + offs_d[None, :],
                   mask=ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, HEAD_DIM]


@triton.jit
def merge_rows(O_part, LSE_part, Out, LSE, o_rows, l_rows, out_rows, lse_rows, row_ok, num_splits, stride_os,
               stride_ls, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_S: tl.constexpr,
               WRITE_LSE: tl.constexpr):
    """Rows given by their offsets into the partials (o_rows, l_rows) and into Out and LSE, every split of
    every row loaded at once: Out = Σ_s exp(lse_s − lse) O_s with lse = log Σ_s exp(lse_s). −inf partials
    weigh 0 (whatever their O holds); all −inf gives 0. LSE is written only with WRITE_LSE."""
    splits = tl.arange(0, BLOCK_S).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    ok = (splits < num_splits)[:, None] & row_ok[None, :]  # [BLOCK_S, rows]
    lse_s = tl.load(LSE_part + splits[:, None] * stride_ls + l_rows[None, :], mask=ok, other=float("-inf"),
                    cache_modifier=".cg")
    o_s = tl.load(O_part + (splits[:, None] * stride_os + o_rows[None, :])[:, :, None] + offs_d[None, None, :],
                  mask=ok[:, :, None] & d_ok[None, None, :], other=0.0, cache_modifier=".cg")  # [BLOCK_S, rows, D]
    lse_max = tl.max(lse_s, 0)  # [rows]
    lse_ref = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    w = tl.math.exp2((lse_s - lse_ref[None, :]) * LOG2E)
    total = tl.sum(w, 0)
    empty = total == 0.0
    out = tl.sum(tl.where((w > 0)[:, :, None], o_s, 0.0) * w[:, :, None], 0)  # [rows, D]
    out = out / tl.where(empty, 1.0, total)[:, None]
    tl.store(Out + out_rows[:, None] + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    if WRITE_LSE:
        tl.store(LSE + lse_rows, tl.where(empty, float("-inf"), lse_ref + tl.log(tl.where(empty, 1.0, total))),
                 mask=row_ok)


@triton.jit
def combine_kernel(O_part, LSE_part, Out, LSE, num_splits, num_rows, seqlen_q, nheads,
                   stride_os, stride_ob, stride_ot, stride_oh, stride_ls, stride_lb, stride_lh,
                   stride_out_b, stride_out_t, stride_out_h, stride_lse_b, stride_lse_h,
                   HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_S: tl.constexpr,
                   MERGE_ROWS: tl.constexpr):
    """MERGE_ROWS (batch, token, head) rows per program: merge ``num_splits`` partials by their LSE."""
    row = tl.program_id(0) * MERGE_ROWS + tl.arange(0, MERGE_ROWS)
    b = (row // (seqlen_q * nheads)).to(tl.int64)
    t = (row // nheads % seqlen_q).to(tl.int64)
    h = (row % nheads).to(tl.int64)
    merge_rows(O_part, LSE_part, Out, LSE, b * stride_ob + t * stride_ot + h * stride_oh,
               b * stride_lb + h * stride_lh + t, b * stride_out_b + t * stride_out_t + h * stride_out_h,
               b * stride_lse_b + h * stride_lse_h + t, row < num_rows, num_splits, stride_os, stride_ls, HEAD_DIM,
               HEAD_DIM_PAD, BLOCK_S, True)


def merge_rows_per_step(block_s, head_dim_pad):
    """Rows merged at once: BLOCK_S x rows x HEAD_DIM float32 within 8192 elements (64 registers a thread
    at 4 warps)."""
    return max(1, min(16, 8192 // (block_s * head_dim_pad)))


def launch_combine(out_partials, lse_partials, out, lse):
    """out_partials (splits, batch, seqlen, nheads, headdim), lse_partials (splits, batch, nheads, seqlen)
    -> out (batch, seqlen, nheads, headdim), lse (batch, nheads, seqlen)."""
    num_splits, batch, seqlen_q, nheads, head_dim = out_partials.shape
    block_s, pad = max(2, next_pow2(num_splits)), next_pow2(head_dim)
    rows, merge_rows = batch * seqlen_q * nheads, merge_rows_per_step(block_s, pad)
    combine_kernel[(cdiv(rows, merge_rows),)](
        out_partials, lse_partials, out, lse, num_splits, rows, seqlen_q, nheads,
        *out_partials.stride()[:4], *lse_partials.stride()[:3], *out.stride()[:3], lse.stride(0), lse.stride(1),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_S=block_s, MERGE_ROWS=merge_rows, num_warps=4)


_REPLAYS = Replays()  # see launch_decode


def launch_decode(q, k_cache, v_cache, cache_seqlens, block_table, batch_idx, out, lse, num_splits, chunk,
                  softmax_scale, window_size, config, scratch=None, leftpad=None, softcap=0.0, alibi_slopes=None,
                  seqlen_new=0):
    """out (batch, seqlen_q, nheads, headdim) and lse (batch, nheads, seqlen_q; None: not written) in one launch:
    a program per (split of ``chunk`` keys, batch, KV head, tile of query rows). With several splits,
    ``scratch`` is (arrivals, part): int32 zeros, one per (batch, KV head, row tile), left zeroed, and float32
    room for the partial results (``partial_elements``). ``leftpad`` (int32 (batch,)): the keys of sequence b
    are cache slots [leftpad[b], cache_seqlens[b] + seqlen_new) (``seqlen_new``: tokens appended this step).
    ``softcap`` > 0 caps the scores at ±softcap by tanh. ``alibi_slopes`` float32 (nheads,) or (batch, nheads):
    ALiBi biases.

    A decode loop calls this with the same shapes, cache and options every step: the first call of a key
    builds the launch, later ones replay it with the step's tensors (kernels/common/replay.py). The key holds the
    caches' addresses (their TMA descriptors are kept) and every pointer's 16-byte alignment."""
    arrivals, part = scratch or (None, None)
    key = (q.shape, q.stride(), q.dtype, q.device, k_cache.shape, k_cache.stride(), v_cache.stride(),
           k_cache.data_ptr(), v_cache.data_ptr(), out.stride(), lse is None or lse.stride(),
           block_table is None or block_table.shape, block_table is None or block_table.stride(), num_splits, chunk,
           softmax_scale, softcap, window_size, config, None if alibi_slopes is None else alibi_slopes.stride(),
           seqlen_new,
           aligned(q, out, lse, cache_seqlens, block_table, batch_idx, arrivals, part, leftpad, alibi_slopes))
    replay = _REPLAYS.get(key)
    if replay is None:
        replay = _first_launch(q, k_cache, v_cache, part, out, lse, arrivals, cache_seqlens, block_table, batch_idx,
                               leftpad, alibi_slopes, num_splits, chunk, softmax_scale, softcap, window_size, config,
                               seqlen_new)
        _REPLAYS.put(key, replay)
    else:
        caches = () if replay.descriptors else (k_cache, v_cache)
        replay.run(q.device, q, part, out, lse, arrivals, cache_seqlens, block_table, batch_idx, leftpad,
                   alibi_slopes, *caches)


def partial_elements(num_splits, batch, seqlen_q, nheads, head_dim):
    """float32 elements of the split partials: O (splits, batch, seqlen_q, nheads, head_dim), then LSE
    (splits, batch, nheads, seqlen_q)."""
    return num_splits * batch * seqlen_q * nheads * (head_dim + 1)


def _first_launch(q, k_cache, v_cache, part, out, lse, arrivals, cache_seqlens, block_table, batch_idx,
                  leftpad, alibi_slopes, num_splits, chunk, softmax_scale, softcap, window_size, config, seqlen_new):
    """Launch through Triton's usual path and return the Replay of it."""
    batch, seqlen_q, nheads, head_dim = q.shape
    nheads_k = k_cache.shape[2]
    group = nheads // nheads_k
    left, right = window_size
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 0
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[1]
    block_m = block_rows(group, seqlen_q, config)
    pad = max(16, next_pow2(head_dim))
    use_tma = reads_by_tma(k_cache, v_cache) and (not paged or page_size % config.block_n == 0)
    if config.heads > 1 and not (use_tma and nheads_k % config.heads == 0 and config.key_groups == 1
                                 and group * seqlen_q <= 16):
        raise ValueError(f"decode config {config}: several KV heads a program need a TMA-addressable cache (pages a "
                         f"multiple of block_n), KV heads they divide, one key group and at most 16 "
                         f"query rows a head; here {'read by TMA' if use_tma else 'read by pointers'}, "
                         f"{nheads_k} KV heads, {group * seqlen_q} query rows a head")
    k_arg, v_arg = host_descriptors(((k_cache, config.block_n), (v_cache, config.block_n)), pad,
                                    config.heads) if use_tma else (k_cache, v_cache)
    split = num_splits > 1
    rows = batch * seqlen_q * nheads  # the partials are contiguous: O (s, b, t, h, d), then LSE (s, b, h, t)
    part_strides = (rows * head_dim, seqlen_q * nheads * head_dim, nheads * head_dim, head_dim, rows,
                    nheads * seqlen_q, seqlen_q)
    grid = (num_splits, batch * nheads_k // config.heads, cdiv(group * seqlen_q, block_m))
    alibi_b = alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0
    args = (q, k_arg, v_arg, part, out, lse, arrivals, cache_seqlens, block_table, batch_idx, leftpad,
            alibi_slopes, tuple(q.stride()[:3]), tuple(k_cache.stride()[:3]) + tuple(v_cache.stride()[:3]),
            part_strides + (num_splits * rows * head_dim, ),
            tuple(out.stride()[:3]) + ((0, 0) if lse is None else tuple(lse.stride()[:2])),
            (seqlen_q, seqlen_new, nheads_k, chunk, capacity),
            (page_size, k_cache.shape[0], block_table.stride(0) if paged else 0),
            (*score_scales(softmax_scale, softcap), alibi_b), (max(left, 0), max(right, 0)))
    block_s = max(2, next_pow2(num_splits))
    kwargs = dict(GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_M=block_m, BLOCK_N=config.block_n,
                  PAGED=paged, USE_TMA=use_tma, MASK_LEFT=left >= 0, MASK_RIGHT=right >= 0, SPLIT=split,
                  BLOCK_S=block_s, MERGE_ROWS=merge_rows_per_step(block_s, pad), HAS_BATCH_IDX=batch_idx is not None,
                  HAS_LEFTPAD=leftpad is not None, SOFTCAP=softcap_mode(q.device, softcap),
                  HAS_ALIBI=alibi_slopes is not None,
                  WRITE_LSE=lse is not None, DOT_PRECISION="ieee" if q.dtype.itemsize == 4 else "tf32",
                  KEY_GROUPS=config.key_groups, HEADS=config.heads,
                  num_warps=config.num_warps, num_stages=config.num_stages)
    slots = ["Q", "Part", "Out", "LSE", "arrivals", "cache_seqlens", "block_table", "batch_idx", "cache_leftpad",
             "Alibi"]
    replay = Replay(flash_decode_split_kernel, grid, args, kwargs, slots + ([] if use_tma else ["K", "V"]))
    if use_tma and replay.compiled is not None:  # the key pins the caches' addresses: keep their descriptors
        replay.descriptors = [detach_descriptor(d) for d in (k_arg, v_arg)]
        replay.pin("K", replay.descriptors[0])
        replay.pin("V", replay.descriptors[1])
    return replay


def reads_by_tma(k_cache, v_cache):
    """Whether the cache's tiles may come as TMA boxes: both tensors TMA-addressable (a paged cache's tiles must also
    fit in a page: BLOCK_N dividing page_size)."""
    return tma_addressable(k_cache) and tma_addressable(v_cache)


def block_rows(group, seqlen_q, config):
    """Query rows per program: the group's heads times the new tokens, from 16 (a tile of a dot) to the config's
    max_rows; more rows take more row tiles."""
    return min(config.max_rows, max(16, next_pow2(group * seqlen_q)))


def arrival_slots(batch, nheads_k, nheads, seqlen_q, config):
    """How many arrival counters launch_decode uses: one per (batch, KV head, tile of query rows)."""
    group = nheads // nheads_k
    return batch * nheads_k * cdiv(group * seqlen_q, block_rows(group, seqlen_q, config))
