"""FlashAttention-2 forward, portable Triton.

One program owns a Q tile (BLOCK_M query rows of one head): it loads the tile once, streams the K/V
tiles its rows may see, keeps the running max ``m_i``, denominator ``l_i`` and accumulator ``acc`` in
registers, and writes O once, normalized, with the row log-sum-exp (natural log) beside it.

Masking (causal, sliding window, ragged tails) costs only on the tiles that cross a boundary: the key
range of a Q tile is split into [lo, full_lo) masked, [full_lo, full_hi) whole, [full_hi, hi) masked.
"""
import functools

import triton
import triton.language as tl

from ..common.online_softmax import (
    LN2,
    LOG2E,
    alibi_slope,
    fold_sink,
    modified_scores,
    online_softmax_step,
    score_scales,
    softcap_mode,
)
from ..common.replay import Replay, Replays, launch_key
from ..common.tiles import (
    band_mask,
    band_tiles,
    cdiv,
    head_dim_pad,
    host_descriptors,
    load_tile,
    q_tile_program,
    sequence_desc,
    store_tile,
)


@triton.jit
def _attend_tiles(acc, l_i, m_i, q, k_desc, v_desc, b, h_k, lo, hi, offs_m, diag, left, right, seqlen_k,
                  qk_scale, softcap_scale, slope, MASKED: tl.constexpr, MASK_LEFT: tl.constexpr,
                  MASK_RIGHT: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                  IS_VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                  DOT_PRECISION: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        k = load_tile(k_desc, b, start_n, h_k, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_N, HEAD_DIM]
        qk = tl.dot(q, k.T, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        qk, _ = modified_scores(qk, softcap_scale, slope,
                                tl.abs((offs_m + diag)[:, None] - (start_n + offs_n)[None, :]).to(tl.float32),
                                SOFTCAP, HAS_ALIBI)
        if MASKED:
            ok = band_mask(offs_m, start_n + offs_n, seqlen_k, diag, left, right, MASK_LEFT, MASK_RIGHT)
            qk = tl.where(ok, qk, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_step(m_i, l_i, qk, qk_scale, MASKED)
        v = load_tile(v_desc, b, start_n, h_k, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_N, HEAD_DIM]
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # [BLOCK_M, HEAD_DIM]
    return acc, l_i, m_i


@triton.jit
def flash_fwd_kernel(
    Q, K, V, O, LSE, cu_seqlens_q, cu_seqlens_k, Alibi, Sinks, qkvo_strides,
    stride_lb, stride_lh, stride_alibi_b,
    seqlen_q, seqlen_k, nheads, group, qk_scale, softcap_scale, alibi_unit, left, right,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, MASK_LEFT: tl.constexpr,
    MASK_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Q, K, V, O: 4-D (batch, seqlen, nheads, headdim) tensor descriptors, or, with IS_VARLEN, pointers
    to packed (total, nheads, headdim) tensors whose sequences cu_seqlens delimit (``qkvo_strides``: their token and
    head strides). SOFTCAP, HAS_ALIBI: flash-attn's softcap and ALiBi (online_softmax.modified_scores; Alibi holds
    the slopes). HAS_SINK: each head's learned sink logit (Sinks, float32 (nheads,)) joins its rows' denominator
    (online_softmax.fold_sink)."""
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_on, stride_oh = qkvo_strides
    start_m, b, h, h_k, q_start, seqlen_q, k_start, seqlen_k = q_tile_program(
        cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, nheads, group, BLOCK_M, IS_VARLEN)
    if start_m < seqlen_q:
        if IS_VARLEN:
            q_desc = sequence_desc(Q, q_start, stride_qn, h * stride_qh, seqlen_q, HEAD_DIM, BLOCK_M, HEAD_DIM_PAD)
            k_desc = sequence_desc(K, k_start, stride_kn, h_k * stride_kh, seqlen_k, HEAD_DIM, BLOCK_N,
                                   HEAD_DIM_PAD)
            v_desc = sequence_desc(V, k_start, stride_vn, h_k * stride_vh, seqlen_k, HEAD_DIM, BLOCK_N,
                                   HEAD_DIM_PAD)
            o_desc = sequence_desc(O, q_start, stride_on, h * stride_oh, seqlen_q, HEAD_DIM, BLOCK_M, HEAD_DIM_PAD)
        else:
            q_desc, k_desc, v_desc, o_desc = Q, K, V, O

        diag = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
        lo, full_lo, full_hi, hi = band_tiles(start_m, seqlen_k, diag, left, right, BLOCK_M, BLOCK_N,
                                              MASK_LEFT, MASK_RIGHT)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
        q = load_tile(q_desc, b, start_m, h, BLOCK_M, HEAD_DIM_PAD, IS_VARLEN)  # [BLOCK_M, HEAD_DIM]
        slope = alibi_slope(Alibi, b, stride_alibi_b, h, alibi_unit, HAS_ALIBI)

        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_desc, v_desc, b, h_k, lo, full_lo, offs_m, diag, left,
                                      right, seqlen_k, qk_scale, softcap_scale, slope, True, MASK_LEFT, MASK_RIGHT,
                                      BLOCK_N, HEAD_DIM_PAD, IS_VARLEN, SOFTCAP, HAS_ALIBI, DOT_PRECISION)
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_desc, v_desc, b, h_k, full_lo, full_hi, offs_m, diag,
                                      left, right, seqlen_k, qk_scale, softcap_scale, slope, False, MASK_LEFT,
                                      MASK_RIGHT, BLOCK_N, HEAD_DIM_PAD, IS_VARLEN, SOFTCAP, HAS_ALIBI, DOT_PRECISION)
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_desc, v_desc, b, h_k, full_hi, hi, offs_m, diag, left,
                                      right, seqlen_k, qk_scale, softcap_scale, slope, True, MASK_LEFT, MASK_RIGHT,
                                      BLOCK_N, HEAD_DIM_PAD, IS_VARLEN, SOFTCAP, HAS_ALIBI, DOT_PRECISION)

        if HAS_SINK:
            alpha, m_i, l_i = fold_sink(m_i, l_i, tl.load(Sinks + h) * LOG2E)
            acc = acc * alpha[:, None]
        empty = l_i == 0.0  # a row with nothing to attend to: O = 0, LSE = -inf (the sink's logit with a sink)
        acc = acc * (1.0 / tl.where(empty, 1.0, l_i))[:, None]
        lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
        store_tile(o_desc, b, start_m, h, acc.to(q.dtype), IS_VARLEN)
        lse_ptrs = LSE + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + q_start + offs_m
        tl.store(lse_ptrs, lse, mask=offs_m < seqlen_q)


_REPLAYS = Replays()


def launch_fwd(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window_size,
               bottom_right, config, softcap=0.0, alibi_slopes=None, sinks=None, found=None):
    """Launch on prepared tensors: q, k, v, out (batch, seqlen, nheads, headdim) with lse (batch, nheads,
    seqlen_q), or packed (total, nheads, headdim) with cu_seqlens and lse (nheads, total_q). ``softcap`` > 0,
    ``alibi_slopes`` (float32 (nheads,) or (batch, nheads), contiguous): flash-attn's softcap and ALiBi; ``sinks``
    (float32 (nheads,), contiguous): a learned sink logit per head. The first call of a launch key goes through
    Triton; later ones replay it (kernels/common/replay.py). ``found`` (a list, or None) gets the key's replay, which
    launch_again launches for a later batch-mode call of the same key."""
    tensors = (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks)
    key = launch_key(tensors, max_seqlen_q, softmax_scale, window_size, bottom_right, config, softcap)
    _REPLAYS.launch(key, q.device, tensors, functools.partial(
        _first_launch, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window_size,
        bottom_right, config, softcap, alibi_slopes, sinks), found)


def launch_again(replay, q, k, v, out, lse, sinks=None):
    """Launch ``replay`` (what launch_fwd's ``found`` got, for a batch-mode call without softcap or ALiBi of the same
    launch key) with this call's tensors; True, as hopper/fwd_launch.launch_again where it launches."""
    replay.launch(q.device, (q, k, v, out, lse, None, None, None, sinks))
    return True


def _first_launch(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window_size,
                  bottom_right, config, softcap, alibi_slopes, sinks):
    """launch_fwd's launch through Triton, as a Replay (a descriptor's slot re-aimed at each call's tensor)."""
    is_varlen = cu_seqlens_q is not None
    nheads, head_dim = q.shape[-2], q.shape[-1]
    pad = head_dim_pad(head_dim)
    left, right = window_size
    if is_varlen:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, max_seqlen_q, 0
        args = (q, k, v, out)
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        args = host_descriptors(((q, config.block_m), (k, config.block_n), (v, config.block_n),
                                 (out, config.block_m)), pad)
        lse_strides = (lse.stride(0), lse.stride(1))
    strides = tuple(s for t in (q, k, v, out) for s in (t.stride(-3), t.stride(-2)))
    grid = (cdiv(seqlen_q, config.block_m), batch * nheads)
    args = (*args, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, strides, *lse_strides,
            alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0, seqlen_q,
            seqlen_k, nheads, nheads // k.shape[-2], *score_scales(softmax_scale, softcap), max(left, 0),
            max(right, 0))
    kwargs = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                  IS_VARLEN=is_varlen, BOTTOM_RIGHT=bottom_right, MASK_LEFT=left >= 0, MASK_RIGHT=right >= 0,
                  SOFTCAP=softcap_mode(q.device, softcap), HAS_ALIBI=alibi_slopes is not None,
                  HAS_SINK=sinks is not None,
                  DOT_PRECISION="ieee" if q.dtype.itemsize == 4 else "tf32", num_warps=config.num_warps,
                  num_stages=config.num_stages)
    return Replay(flash_fwd_kernel, grid, args, kwargs, ["Q", "K", "V", "O", "LSE", "cu_seqlens_q", "cu_seqlens_k",
                                                         "Alibi", "Sinks"])
