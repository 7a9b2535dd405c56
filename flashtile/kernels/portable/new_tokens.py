"""The new tokens of flash_attn_with_kvcache: rotary position embedding of q, and the in-place append of k (turned
the same way) and v to the KV cache, one launch each.

Token t of sequence b sits at position cache_seqlens[b] + t (PER_TOKEN), or every token at cache_seqlens[b].
Its first ROTARY_DIM features turn by the angles of that position's row of cos and sin: pairs (2i, 2i + 1)
when INTERLEAVED (GPT-J), else (i, i + ROTARY_DIM / 2) (GPT-NeoX); the rest are copied. float32 math.
Whatever cache_seqlens, block_table and cache_batch_idx hold, neither kernel reads or writes outside its tensors:
positions are clamped to the rotary table's rows, cache rows and pages to the cache, and a token whose slot lies
outside the capacity of its sequence's cache is not written.
"""
import torch
import triton
import triton.language as tl

from ..common.replay import Replay, Replays, aligned


@triton.jit
def _copy_turned(x_rows, o_rows, Cos, Sin, pos, stride_cos, stride_sin, nheads, HEAD_DIM: tl.constexpr,
                 ROTARY_HALF: tl.constexpr, HALF_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                 BLOCK_H: tl.constexpr, ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Copy one token's heads from x_rows to o_rows ([BLOCK_H] row pointers), turning the first 2·ROTARY_HALF
    features by the rotary angles of position ``pos`` when ROTARY."""
    offs_h = tl.arange(0, BLOCK_H)
    h_ok = (offs_h < nheads)[:, None]
    first_kept = 0
    if ROTARY:
        offs_r = tl.arange(0, HALF_PAD)
        in_half = offs_r < ROTARY_HALF
        cos = tl.load(Cos + pos * stride_cos + offs_r, mask=in_half, other=1.0).to(tl.float32)  # [HALF_PAD]
        sin = tl.load(Sin + pos * stride_sin + offs_r, mask=in_half, other=0.0).to(tl.float32)
        if INTERLEAVED:
            first, second = 2 * offs_r, 2 * offs_r + 1
        else:
            first, second = offs_r, offs_r + ROTARY_HALF
        ok = h_ok & in_half[None, :]
        x1 = tl.load(x_rows[:, None] + first[None, :], mask=ok).to(tl.float32)  # [BLOCK_H, HALF_PAD]
        x2 = tl.load(x_rows[:, None] + second[None, :], mask=ok).to(tl.float32)
        out_ty = o_rows.dtype.element_ty
        tl.store(o_rows[:, None] + first[None, :], (x1 * cos[None, :] - x2 * sin[None, :]).to(out_ty), mask=ok)
        tl.store(o_rows[:, None] + second[None, :], (x1 * sin[None, :] + x2 * cos[None, :]).to(out_ty), mask=ok)
        first_kept = 2 * ROTARY_HALF
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    keep = h_ok & ((offs_d >= first_kept) & (offs_d < HEAD_DIM))[None, :]
    tl.store(o_rows[:, None] + offs_d[None, :], tl.load(x_rows[:, None] + offs_d[None, :], mask=keep), mask=keep)


@triton.jit
def rotary_kernel(X, Out, Cos, Sin, cache_seqlens, stride_xb, stride_xn, stride_xh, stride_ob, stride_on, stride_oh,
                  stride_cos, stride_sin, nheads, rotary_rows, HEAD_DIM: tl.constexpr, ROTARY_HALF: tl.constexpr,
                  HALF_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_H: tl.constexpr, PER_TOKEN: tl.constexpr,
                  INTERLEAVED: tl.constexpr):
    """Grid (seqlen, batch): every head of one token of q, turned into Out."""
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    pos = tl.load(cache_seqlens + b).to(tl.int64)
    if PER_TOKEN:
        pos += t
    pos = tl.minimum(tl.maximum(pos, 0), rotary_rows - 1)
    offs_h = tl.arange(0, BLOCK_H)
    _copy_turned(X + b * stride_xb + t * stride_xn + offs_h * stride_xh,
                 Out + b * stride_ob + t * stride_on + offs_h * stride_oh, Cos, Sin, pos, stride_cos, stride_sin,
                 nheads, HEAD_DIM, ROTARY_HALF, HALF_PAD, HEAD_DIM_PAD, BLOCK_H, True, INTERLEAVED)


@triton.jit
def append_kernel(K, V, K_cache, V_cache, Cos, Sin, cache_seqlens, block_table, batch_idx, stride_kb, stride_kn,
                  stride_kh, stride_vb, stride_vn, stride_vh, stride_kcp, stride_kcs, stride_kch, stride_vcp,
                  stride_vcs, stride_vch, stride_bt, stride_cos, stride_sin, nheads_k, page_size, capacity, cache_rows,
                  rotary_rows, HEAD_DIM: tl.constexpr, ROTARY_HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                  HEAD_DIM_PAD: tl.constexpr, BLOCK_H: tl.constexpr, ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr,
                  PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr):
    """Grid (seqlen_new, batch): new token t of sequence b into its cache slot cache_seqlens[b] + t (a page of
    block_table when PAGED, else row batch_idx[b] or b), k turned by the rotary angles of that position; a slot
    outside [0, capacity) is not written."""
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    pos = tl.load(cache_seqlens + b).to(tl.int64) + t
    if (pos >= 0) & (pos < capacity):
        if PAGED:
            row = tl.load(block_table + b * stride_bt + pos // page_size)
            slot = pos % page_size
        else:
            row = tl.load(batch_idx + b) if HAS_BATCH_IDX else b
            slot = pos
        row = tl.minimum(tl.maximum(row, 0), cache_rows - 1).to(tl.int64)
        angle = tl.minimum(pos, rotary_rows - 1)
        offs_h = tl.arange(0, BLOCK_H)
        _copy_turned(K + b * stride_kb + t * stride_kn + offs_h * stride_kh,
                     K_cache + row * stride_kcp + slot * stride_kcs + offs_h * stride_kch, Cos, Sin, angle, stride_cos,
                     stride_sin, nheads_k, HEAD_DIM, ROTARY_HALF, HALF_PAD, HEAD_DIM_PAD, BLOCK_H, ROTARY, INTERLEAVED)
        _copy_turned(V + b * stride_vb + t * stride_vn + offs_h * stride_vh,
                     V_cache + row * stride_vcp + slot * stride_vcs + offs_h * stride_vch, Cos, Sin, angle, stride_cos,
                     stride_sin, nheads_k, HEAD_DIM, ROTARY_HALF, HALF_PAD, HEAD_DIM_PAD, BLOCK_H, False, INTERLEAVED)


def _tiles(x, cos):
    """Constexprs shared by both kernels: the head dim, half the rotary dim and their padded sizes."""
    half = 0 if cos is None else cos.shape[1]
    return dict(HEAD_DIM=x.shape[-1], ROTARY_HALF=half, HALF_PAD=triton.next_power_of_2(max(half, 1)),
                HEAD_DIM_PAD=triton.next_power_of_2(x.shape[-1]), BLOCK_H=triton.next_power_of_2(x.shape[2]))


_REPLAYS = Replays()  # a decode loop repeats its shapes: later steps replay the launch (kernels/common/replay.py)


def _launch(kernel, grid, key, slots, tensors, first):
    """``kernel[grid](*tensors, *scalars, **kwargs)`` with (scalars, kwargs) = first(), replayed with new
    ``tensors`` when ``key`` was seen (first() runs only then)."""
    replay = _REPLAYS.get(key)
    if replay is None:
        scalars, kwargs = first()
        _REPLAYS.put(key, Replay(kernel, grid, tensors + scalars, kwargs, slots))
    else:
        replay.run(tensors[0].device, *tensors)


def launch_rotary(x, cos, sin, cache_seqlens, per_token, interleaved):
    """x (batch, seqlen, nheads, headdim) turned by cos, sin (seqlen_ro, rotary_dim / 2) at the positions above;
    cache_seqlens int32 (batch,). Returns a new tensor shaped like x."""
    batch, seqlen, nheads, _ = x.shape
    out = torch.empty_like(x)
    tensors = (x, out, cos, sin, cache_seqlens)
    key = ("rotary", x.shape, x.stride(), x.dtype, x.device, cos.shape, cos.stride(), cos.dtype, sin.stride(),
           sin.dtype, per_token, interleaved, aligned(*tensors))
    _launch(rotary_kernel, (seqlen, batch), key, ["X", "Out", "Cos", "Sin", "cache_seqlens"], tensors, lambda: (
        (*x.stride()[:3], *out.stride()[:3], cos.stride(0), sin.stride(0), nheads, cos.shape[0]),
        dict(PER_TOKEN=per_token, INTERLEAVED=interleaved, **_tiles(x, cos))))
    return out


def launch_append(k, v, k_cache, v_cache, cache_seqlens, block_table, batch_idx, cos=None, sin=None,
                  interleaved=True):
    """Write k, v (batch, seqlen_new, nheads_k, headdim) into the cache at cache_seqlens[b] onwards, in place;
    k turned by cos, sin (seqlen_ro, rotary_dim / 2) when given. The cache is (batch_cache, seqlen_cache,
    nheads_k, headdim), or paged (num_pages, page_size, nheads_k, headdim) with block_table (batch, max_pages)."""
    batch, seqlen_new, nheads_k, _ = k.shape
    paged = block_table is not None
    tensors = (k, v, k_cache, v_cache, cos, sin, cache_seqlens, block_table, batch_idx)
    key = ("append", k.shape, k.stride(), v.stride(), k.dtype, k.device, k_cache.shape, k_cache.stride(),
           v_cache.stride(), None if cos is None else (cos.shape, cos.stride(), cos.dtype, sin.stride(), sin.dtype),
           None if block_table is None else (block_table.shape, block_table.stride()), batch_idx is None,
           interleaved, aligned(*tensors))
    _launch(append_kernel, (seqlen_new, batch), key,
            ["K", "V", "K_cache", "V_cache", "Cos", "Sin", "cache_seqlens", "block_table", "batch_idx"], tensors,
            lambda: ((*k.stride()[:3], *v.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3],
                      block_table.stride(0) if paged else 0, 0 if cos is None else cos.stride(0),
                      0 if sin is None else sin.stride(0), nheads_k, k_cache.shape[1] if paged else 0,
                      block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1], k_cache.shape[0],
                      1 if cos is None else cos.shape[0]),
                     dict(ROTARY=cos is not None, INTERLEAVED=interleaved, PAGED=paged,
                          HAS_BATCH_IDX=batch_idx is not None, **_tiles(k, cos))))
