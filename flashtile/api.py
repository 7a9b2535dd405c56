"""Public entry points, drop-in for flash-attn 2.x and for torch's scaled_dot_product_attention."""
import torch

from . import checks, ops


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Attention on (batch, seqlen, nheads, headdim) tensors, as ``flash_attn.flash_attn_func``.

    k and v may have fewer heads than q (GQA/MQA: query head h reads KV head h // (nheads // nheads_k)).
    ``causal`` aligns the mask bottom-right when seqlen_q != seqlen_k; ``window_size=(left, right)``
    keeps keys within left before and right after the diagonal (-1: unbounded).
    Returns out, or (out, softmax_lse [batch, nheads, seqlen_q], None) with ``return_attn_probs``.
    Differentiable: ``deterministic=True`` makes dQ, dK, dV bitwise reproducible (dQ gets its own pass
    instead of atomics). The gradient of the returned LSE is not propagated.
    """
    checks.not_implemented(dropout_p=dropout_p, softcap=softcap, alibi_slopes=alibi_slopes)
    checks.qkv(q, k, v, packed=False)
    scale = checks.softmax_scale(softmax_scale, q.shape[-1])
    window = checks.window(window_size, causal)
    out, lse = ops.flash_attention(q, k, v, scale, window, bottom_right=True, deterministic=deterministic)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Attention on packed (total_tokens, nheads, headdim) sequences, as flash-attn's varlen function.

    Sequence b holds rows cu_seqlens[b]:cu_seqlens[b + 1] (int32). Returns out, or (out, softmax_lse
    [nheads, total_q], None) with ``return_attn_probs``.
    """
    checks.not_implemented(dropout_p=dropout_p, softcap=softcap, alibi_slopes=alibi_slopes)
    checks.qkv(q, k, v, packed=True)
    checks.cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q", q.device)
    checks.cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k", q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.numel()} offsets but cu_seqlens_k has "
                         f"{cu_seqlens_k.numel()}; both must be batch + 1")
    scale = checks.softmax_scale(softmax_scale, q.shape[-1])
    window = checks.window(window_size, causal)
    out, lse = ops.flash_attention(q, k, v, scale, window, bottom_right=True, deterministic=deterministic,
                                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                   max_seqlen_k=max_seqlen_k)
    return (out, lse, None) if return_attn_probs else out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention`` on (batch, nheads, seqlen, headdim) tensors.

    As in PyTorch, ``is_causal`` aligns the mask top-left (query i sees keys 0..i) and key/value may
    have fewer heads than query only with ``enable_gqa=True``.
    """
    checks.not_implemented(attn_mask=attn_mask, dropout_p=dropout_p)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D (batch, nheads, seqlen, headdim) tensor, got {shape}")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass enable_gqa=True "
                         "for grouped-query attention")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    checks.qkv(q, k, v, packed=False)
    softmax_scale = checks.softmax_scale(scale, q.shape[-1])
    window = checks.window((-1, -1), is_causal)
    out, _ = ops.flash_attention(q, k, v, softmax_scale, window, bottom_right=False, heads_first_out=True)
    return out.transpose(1, 2)
