"""Rotary position embedding of the new tokens in flash_attn_with_kvcache (q and the k written to the cache).

Token t of sequence b sits at position cache_seqlens[b] + t (PER_TOKEN), or every token at cache_seqlens[b].
Its first ROTARY_DIM features turn by the angles of that position's row of cos and sin: pairs (2i, 2i + 1)
when INTERLEAVED (GPT-J), else (i, i + ROTARY_DIM / 2) (GPT-NeoX); the rest are copied. float32 math.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def rotary_kernel(X, Out, Cos, Sin, cache_seqlens, stride_xb, stride_xn, stride_xh, stride_ob, stride_on, stride_oh,
                  stride_cos, stride_sin, nheads, HEAD_DIM: tl.constexpr, ROTARY_HALF: tl.constexpr,
                  HALF_PAD: tl.constexpr, REST_PAD: tl.constexpr, BLOCK_H: tl.constexpr, PER_TOKEN: tl.constexpr,
                  INTERLEAVED: tl.constexpr):
    """Grid (seqlen, batch): every head of one token."""
    t = tl.program_id(0)
    b = tl.program_id(1)
    pos = tl.load(cache_seqlens + b).to(tl.int64)
    if PER_TOKEN:
        pos += t
    offs_r = tl.arange(0, HALF_PAD)
    in_half = offs_r < ROTARY_HALF
    cos = tl.load(Cos + pos * stride_cos + offs_r, mask=in_half, other=1.0).to(tl.float32)  # [HALF_PAD]
    sin = tl.load(Sin + pos * stride_sin + offs_r, mask=in_half, other=0.0).to(tl.float32)
    if INTERLEAVED:
        first, second = 2 * offs_r, 2 * offs_r + 1
    else:
        first, second = offs_r, offs_r + ROTARY_HALF
    offs_h = tl.arange(0, BLOCK_H)
    x_row = X + b.to(tl.int64) * stride_xb + t.to(tl.int64) * stride_xn + offs_h[:, None] * stride_xh
    o_row = Out + b.to(tl.int64) * stride_ob + t.to(tl.int64) * stride_on + offs_h[:, None] * stride_oh
    ok = (offs_h < nheads)[:, None] & in_half[None, :]
    x1 = tl.load(x_row + first[None, :], mask=ok).to(tl.float32)  # [BLOCK_H, HALF_PAD]
    x2 = tl.load(x_row + second[None, :], mask=ok).to(tl.float32)
    tl.store(o_row + first[None, :], (x1 * cos[None, :] - x2 * sin[None, :]).to(Out.dtype.element_ty), mask=ok)
    tl.store(o_row + second[None, :], (x1 * sin[None, :] + x2 * cos[None, :]).to(Out.dtype.element_ty), mask=ok)
    if REST_PAD > 0:
        offs_d = 2 * ROTARY_HALF + tl.arange(0, REST_PAD)
        keep = (offs_h < nheads)[:, None] & (offs_d < HEAD_DIM)[None, :]
        tl.store(o_row + offs_d[None, :], tl.load(x_row + offs_d[None, :], mask=keep), mask=keep)


def launch_rotary(x, cos, sin, cache_seqlens, per_token, interleaved):
    """x (batch, seqlen, nheads, headdim) turned by cos, sin (seqlen_ro, rotary_dim / 2) at the positions above;
    cache_seqlens int32 (batch,). Returns a new tensor shaped like x."""
    batch, seqlen, nheads, head_dim = x.shape
    out = torch.empty_like(x)
    half = cos.shape[1]
    rest = head_dim - 2 * half
    rotary_kernel[(seqlen, batch)](
        x, out, cos, sin, cache_seqlens, x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1),
        out.stride(2), cos.stride(0), sin.stride(0), nheads, HEAD_DIM=head_dim, ROTARY_HALF=half,
        HALF_PAD=triton.next_power_of_2(half), REST_PAD=triton.next_power_of_2(rest) if rest else 0,
        BLOCK_H=triton.next_power_of_2(nheads), PER_TOKEN=per_token, INTERLEAVED=interleaved)
    return out
