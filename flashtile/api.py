"""Public entry points, drop-in for flash-attn 2.x and for torch's scaled_dot_product_attention."""
from typing import Optional, Union

import torch
from torch import Tensor

from . import checks, ops

Window = tuple[int, int]
Result = Union[Tensor, tuple[Tensor, Tensor, None]]  # out, or (out, softmax_lse, None) with return_attn_probs


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Window = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, learnable_sink: Optional[Tensor] = None) -> Result:
    """Attention on (batch, seqlen, nheads, headdim) tensors, as ``flash_attn.flash_attn_func``.

    k and v may have fewer heads than q (GQA/MQA: query head h reads KV head h // (nheads // nheads_k)).
    ``causal`` aligns the mask bottom-right when seqlen_q != seqlen_k; ``window_size=(left, right)``
    keeps keys within left before and right after the diagonal (-1: unbounded).
    Returns out, or (out, softmax_lse [batch, nheads, seqlen_q], None) with ``return_attn_probs``.
    Differentiable: ``deterministic=True`` makes dQ, dK, dV bitwise reproducible (dQ gets its own pass
    instead of atomics), and so is the returned LSE (its gradient joins dQ, dK). ``softcap`` > 0 caps the scores
    at softcap · tanh(score / softcap); ``alibi_slopes`` (float32 (nheads,) or (batch, nheads)) adds
    −slope · |i + seqlen_k − seqlen_q − j| after it (both on the portable kernels). ``learnable_sink`` (nheads,),
    as FA4's (gpt-oss's attention sinks): a logit per head that joins each row's softmax denominator only; the LSE
    returned then counts it, and the sinks take a gradient too.
    """
    checks.not_implemented(dropout_p=dropout_p)
    checks.qkv(q, k, v, packed=False)
    scale = checks.softmax_scale(softmax_scale, q.shape[-1])
    window = checks.window(window_size, causal)
    softcap = checks.softcap(softcap)
    checks.alibi_slopes(alibi_slopes, q.shape[0], q.shape[2], q.device)
    _check_sink(learnable_sink, q.shape[2], q.device)
    out, lse = ops.flash_attention(q, k, v, scale, window, bottom_right=True, deterministic=deterministic,
                                   softcap=softcap, alibi_slopes=alibi_slopes, sinks=learnable_sink)
    return (out, lse, None) if return_attn_probs else out


def _check_sink(learnable_sink: Optional[Tensor], nheads: int, device: torch.device) -> None:
    if learnable_sink is None:
        return
    if not isinstance(learnable_sink, torch.Tensor):
        raise TypeError(f"learnable_sink must be a torch.Tensor, got {type(learnable_sink).__name__}")
    if not learnable_sink.is_floating_point():
        raise TypeError(f"learnable_sink must be a floating-point tensor, got {learnable_sink.dtype}")
    if learnable_sink.shape != (nheads, ) or learnable_sink.device != device:
        raise ValueError(f"learnable_sink must have shape ({nheads},) on {device} (one logit per query head), got "
                         f"{tuple(learnable_sink.shape)} on {learnable_sink.device}")


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: Union[int, Tensor], max_seqlen_k: Union[int, Tensor], dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False, window_size: Window = (-1, -1),
                           softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[Tensor] = None,
                           learnable_sink: Optional[Tensor] = None) -> Result:
    """Attention on packed (total_tokens, nheads, headdim) sequences, as flash-attn's varlen function.

    Sequence b holds rows cu_seqlens[b]:cu_seqlens[b + 1] (int32); rows from cu_seqlens_q[-1] on belong to no
    sequence and get out = 0, LSE = -inf (and dq = 0; dk = dv = 0 from cu_seqlens_k[-1] on). ``max_seqlen_q``,
    ``max_seqlen_k``: ints or 0-d integer tensors. Returns out, or (out, softmax_lse [nheads, total_q], None) with
    ``return_attn_probs``. With ``block_table`` (batch, max_pages) int32, k and v are pages (num_pages, page_size,
    nheads_k, headdim), as flash-attn's paged prefill: they are gathered into batch · max_seqlen_k packed keys first
    (a copy, sized without reading cu_seqlens_k back).
    ``learnable_sink`` as in flash_attn_func.
    """
    checks.not_implemented(dropout_p=dropout_p)
    if block_table is not None:
        checks.page_table(block_table, cu_seqlens_q.numel() - 1 if isinstance(cu_seqlens_q, torch.Tensor) else 0,
                           q.device)
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() == v.dim() == 4):
            raise ValueError("with block_table, k and v must be pages (num_pages, page_size, nheads_k, headdim)")
        max_seqlen_k = checks.host_int("max_seqlen_k", max_seqlen_k)  # (checked below with the gathered keys)
        k, v = ops.gather_pages(k, v, block_table, cu_seqlens_k, block_table.shape[0] * max(max_seqlen_k, 0))
    checks.qkv(q, k, v, packed=True)
    max_seqlen_q = checks.cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q", q.device)
    max_seqlen_k = checks.cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k", q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.numel()} offsets but cu_seqlens_k has "
                         f"{cu_seqlens_k.numel()}; both must be batch + 1")
    scale = checks.softmax_scale(softmax_scale, q.shape[-1])
    window = checks.window(window_size, causal)
    softcap = checks.softcap(softcap)
    checks.alibi_slopes(alibi_slopes, cu_seqlens_q.numel() - 1, q.shape[1], q.device)
    _check_sink(learnable_sink, q.shape[1], q.device)
    out, lse = ops.flash_attention(q, k, v, scale, window, bottom_right=True, deterministic=deterministic,
                                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                   max_seqlen_k=max_seqlen_k, softcap=softcap, alibi_slopes=alibi_slopes,
                                   sinks=learnable_sink)
    return (out, lse, None) if return_attn_probs else out


def _unpack(name: str, packed: Tensor, parts: int, layout: str) -> tuple[Tensor, ...]:
    """The ``parts`` tensors packed along the dim before the heads of ``packed`` (views: gradients reach it)."""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(packed).__name__}")
    ndim = layout.count(",") + 1
    dim = ndim - 3
    if packed.dim() != ndim or packed.shape[dim] != parts:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(packed.shape)}")
    if packed.requires_grad and torch.is_grad_enabled() and not torch.compiler.is_compiling():
        return _Unpack.apply(packed, dim)
    return packed.unbind(dim)


class _Unpack(torch.autograd.Function):
    """packed.unbind(dim), whose backward hands on the gradients' own packed tensor where they are its slices
    (ops.shared_grads) instead of stacking them into a new one."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, packed: Tensor, dim: int) -> tuple[Tensor, ...]:
        ctx.dim, ctx.part_shape = dim, packed.shape[:dim] + packed.shape[dim + 1:]
        ctx.set_materialize_grads(False)
        return packed.unbind(dim)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, *grads: Optional[Tensor]) -> tuple[Tensor, None]:
        base = grads[0]._base if grads[0] is not None else None
        if base is not None and all(g is not None and g._base is base for g in grads) and ops.packed_shape(
                *grads) == base.shape:
            return base, None
        like = next((g for g in grads if g is not None), None)
        if like is None:
            return None, None
        return torch.stack([like.new_zeros(ctx.part_shape) if g is None else g for g in grads], ctx.dim), None


def flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                              causal: bool = False, window_size: Window = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                              return_attn_probs: bool = False) -> Result:
    """flash_attn_func on qkv (batch, seqlen, 3, nheads, headdim), as flash-attn's; dqkv comes back packed."""
    q, k, v = _unpack("qkv", qkv, 3, "(batch, seqlen, 3, nheads, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                             causal: bool = False, window_size: Window = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                             return_attn_probs: bool = False) -> Result:
    """flash_attn_func with kv (batch, seqlen_k, 2, nheads_k, headdim), as flash-attn's."""
    k, v = _unpack("kv", kv, 2, "(batch, seqlen_k, 2, nheads_k, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: Union[int, Tensor],
                                     dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                     causal: bool = False, window_size: Window = (-1, -1), softcap: float = 0.0,
                                     alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                     return_attn_probs: bool = False) -> Result:
    """flash_attn_varlen_func on qkv (total, 3, nheads, headdim) with one cu_seqlens, as flash-attn's."""
    q, k, v = _unpack("qkv", qkv, 3, "(total, 3, nheads, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                    max_seqlen_q: Union[int, Tensor], max_seqlen_k: Union[int, Tensor],
                                    dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                    causal: bool = False, window_size: Window = (-1, -1), softcap: float = 0.0,
                                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                    return_attn_probs: bool = False) -> Result:
    """flash_attn_varlen_func with kv (total_k, 2, nheads_k, headdim), as flash-attn's."""
    k, v = _unpack("kv", kv, 2, "(total_k, 2, nheads_k, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
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


def flash_attn_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor] = None,
                            v: Optional[Tensor] = None, rotary_cos: Optional[Tensor] = None,
                            rotary_sin: Optional[Tensor] = None, cache_seqlens: Union[None, int, Tensor] = None,
                            cache_batch_idx: Optional[Tensor] = None, cache_leftpad: Optional[Tensor] = None,
                            block_table: Optional[Tensor] = None, softmax_scale: Optional[float] = None,
                            causal: bool = False, window_size: Window = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Optional[Tensor] = None,
                            num_splits: int = 0,
                            return_softmax_lse: bool = False) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """Decoding attention over a KV cache, as flash-attn's ``flash_attn_with_kvcache`` (flash decoding).

    q (batch, seqlen_q, nheads, headdim): the new queries (seqlen_q > 1 for speculative decoding or chunked
    prefill; with ``causal`` they sit at the end of the cache, aligned bottom-right). k_cache, v_cache:
    (batch_cache, seqlen_cache, nheads_k, headdim), or paged (num_pages, page_size, nheads_k, headdim) with
    ``block_table`` (batch, max_pages) int32: any page size (its speed against a contiguous cache's:
    docs/perf/decode.md).
    ``cache_seqlens`` (int or int32 (batch,)): keys already in the cache; new ``k``, ``v`` (batch, seqlen_new,
    nheads_k, headdim) are written there in place first. ``cache_batch_idx`` (int32 (batch,)) picks the cache rows
    of a contiguous cache. ``num_splits=0`` chooses the split count from the SM count, batch, heads and cache
    size. ``rotary_cos``, ``rotary_sin`` (seqlen_ro, rotary_dim / 2), with k and v: the new keys are turned at
    positions cache_seqlens[b] + t before they are written, the queries too (at cache_seqlens[b] + t if causal or
    windowed, else all at cache_seqlens[b]); ``rotary_interleaved`` pairs features (2i, 2i + 1), else
    (i, i + rotary_dim / 2). ``cache_leftpad`` (int32 (batch,)): sequence b's keys start at that slot (left
    padding), up to cache_seqlens[b]; rotary positions stay the slots' own indices. ``softcap`` > 0 caps the scores:
    softcap · tanh(softmax_scale · q·k / softcap). ``alibi_slopes`` (float32 (nheads,) or (batch, nheads)) adds
    −slope · |i + seqlen_k − seqlen_q − j| to the score of query i and key j (after the cap).
    Index tensors on the GPU are not read back to the host (no sync): a value outside what it indexes gives a wrong
    result but no access outside the tensors (the kernels clamp it); ``set_value_checks(True)`` checks them too.
    Returns out, or (out, softmax_lse [batch, nheads, seqlen_q]) with ``return_softmax_lse``.
    """
    softcap = checks.softcap(softcap)
    window = checks.window(window_size, causal)
    per_token = window != (-1, -1)  # rotary positions: causal or windowed queries sit at their own tokens
    rotary_rows, rotary_span = checks.rotary(rotary_cos, rotary_sin, rotary_interleaved, q, k, per_token)
    paged, capacity = checks.kvcache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
                                     cache_leftpad, rotary_rows, rotary_span)
    checks.alibi_slopes(alibi_slopes, q.shape[0], q.shape[2], q.device)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: automatic), got {num_splits!r}")
    scale = checks.softmax_scale(softmax_scale, q.shape[-1])
    batch, device = q.shape[0], q.device
    if cache_seqlens is None:
        seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=device)
    elif isinstance(cache_seqlens, torch.Tensor):
        seqlens = cache_seqlens
    else:
        seqlens = torch.full((batch,), int(cache_seqlens), dtype=torch.int32, device=device)
    batch_idx = None if paged else cache_batch_idx  # None: sequence b is cache row b
    if rotary_cos is not None:
        q = ops.rotary(q, rotary_cos, rotary_sin, seqlens, per_token, rotary_interleaved)
    if k is not None:
        ops.append_to_cache(k_cache, v_cache, k, v, seqlens, batch_idx, block_table, rotary_cos, rotary_sin,
                            rotary_interleaved)
    out, lse = ops.kvcache_forward(q, k_cache, v_cache, seqlens, batch_idx, block_table, capacity, scale, window,
                                   num_splits, leftpad=cache_leftpad, softcap=softcap, alibi_slopes=alibi_slopes,
                                   want_lse=return_softmax_lse, seqlen_new=0 if k is None else k.shape[1])
    return (out, lse) if return_softmax_lse else out


def combine(out_partials: Tensor, lse_partials: Tensor) -> Tensor:
    """Merge attention computed over disjoint key sets (splits of the KV cache, ring or context-parallel
    shards) exactly, by log-sum-exp. out_partials (splits, batch, seqlen, nheads, headdim) and float32
    lse_partials (splits, batch, nheads, seqlen), as our forward returns them. A partial whose LSE is
    -inf contributes nothing; rows where every LSE is -inf give 0. Returns (batch, seqlen, nheads, headdim).
    """
    checks.partials(out_partials, lse_partials)
    with torch.no_grad():
        return ops.combine(out_partials, lse_partials)[0]
