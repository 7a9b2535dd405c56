"""Every input check, run before any launch. Each failure names the argument that caused it."""
import math
import numbers
import os
from typing import Optional, Union

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_value_checks = {"1": True, "0": False}.get(os.environ.get("FLASHTILE_VALUE_CHECKS", ""), None)
_interpreter = os.environ.get("TRITON_INTERPRET", "0") == "1"  # read once, as triton did when our kernels loaded


def set_value_checks(enabled: Optional[bool]) -> None:
    """The checks of index values (cu_seqlens, cache_seqlens, cache_leftpad, block_table, cache_batch_idx): a
    ValueError naming the argument when one lies outside what it indexes. None (the default; FLASHTILE_VALUE_CHECKS
    unset): they run where the values already live on the host (ints, CPU tensors) and cost nothing; values on the
    GPU are not read back, and the kernels clamp every index into its tensors instead, so that a wrong value gives a
    wrong result but never a read or write outside them. True (FLASHTILE_VALUE_CHECKS=1): a debug mode that reads
    them back too, a GPU sync per call (skipped while tracing or capturing a CUDA graph). False
    (FLASHTILE_VALUE_CHECKS=0): never."""
    global _value_checks
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"set_value_checks takes True, False or None, got {enabled!r}")
    _value_checks = enabled
MAX_HEAD_DIM = 256  # flash-attn's limit; a head dim that is not a multiple of 8 is padded with zeros (ops)


def interpreter_enabled() -> bool:
    return _interpreter


def _tensor(name: str, t: object) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def host_int(name: str, value: Union[int, torch.Tensor]) -> int:
    """An int argument that flash-attn also takes as a 0-d integer tensor (``cu_seqlens.diff().max()``, an entry of
    ``window_size``); a tensor on the GPU is read back to the host, one sync, as flash-attn does."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dim() > 1 or value.dtype.is_floating_point or value.dtype.is_complex \
                or value.dtype == torch.bool:
            raise TypeError(f"{name} must be an int or a 0-d integer tensor, got a {value.dtype} tensor of shape "
                            f"{tuple(value.shape)}")
        return int(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def softcap(value: float) -> float:
    """flash-attn's softcap: a number >= 0 (0: off). Returns it as a float."""
    if type(value) in (float, int) and value == 0.0:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"softcap must be a finite number >= 0 (0: off), got {value!r}")
    return float(value)


def alibi_slopes(slopes: Optional[torch.Tensor], batch: int, nheads: int, device: torch.device) -> None:
    """ALiBi slopes: None, or float32 (nheads,) or (batch, nheads) on q's device."""
    if slopes is None:
        return
    _tensor("alibi_slopes", slopes)
    if slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes must be float32, got {slopes.dtype}")
    if tuple(slopes.shape) not in ((nheads,), (batch, nheads)):
        raise ValueError(f"alibi_slopes must be (nheads={nheads},) or (batch={batch}, nheads={nheads}), got "
                         f"{tuple(slopes.shape)}")
    if slopes.device != device:
        raise ValueError(f"alibi_slopes is on {slopes.device}, q on {device}")


_INSTEAD = {"attn_mask": "is_causal=True gives a causal mask, and flash_attn_varlen_func packs sequences of "
                         "different lengths without padding",
            "dropout_p": "dropout_p=0.0",
            "leftpad_k": "pack each sequence's keys from its first used row (cu_seqlens_k marks where they start)",
            "seqused_k": "cu_seqlens_k that counts only the keys each sequence uses (pack them)"}


def not_implemented(**options: object) -> None:
    """Options flashtile does not implement yet must keep their neutral value."""
    neutral = {"dropout_p": 0.0, "attn_mask": None, "leftpad_k": None, "seqused_k": None}
    for name, value in options.items():
        if value is None and neutral[name] is None:
            continue
        if neutral[name] is None or value != neutral[name]:
            shown = (f"a {value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor)
                     else repr(value))
            raise NotImplementedError(f"{name} is not supported by flashtile yet (got {shown}); instead: "
                                      f"{_INSTEAD[name]}")


def _signature(*values: object) -> tuple:
    """What the shape and type checks read: shape, dtype and device of each tensor, the type of the rest."""
    return tuple([(v.shape, v.dtype, v.device) if isinstance(v, torch.Tensor) else None if v is None else type(v)
                  for v in values])


_QKV_PASSED = set()  # signatures of q, k, v that passed qkv (the checks read nothing else)


def qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: bool,
        names: tuple[str, str, str] = ("q", "k", "v")) -> None:
    """q, k, v as (batch, seqlen, nheads, headdim), or (total, nheads, headdim) when ``packed``. Each signature
    is checked once (a model calls with the same shapes every step)."""
    key = (_signature(q, k, v), packed, names, interpreter_enabled())
    if key in _QKV_PASSED:
        return
    _qkv(q, k, v, packed, names)
    if len(_QKV_PASSED) >= 1024:
        _QKV_PASSED.clear()
    _QKV_PASSED.add(key)


def _interpreter_loaded_late() -> bool:
    """TRITON_INTERPRET=1 takes effect only if set before triton is first imported: triton's own helpers are made
    then. True where our flag says interpreter but triton's helpers were built for the GPU, or the other way."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(tl.standard.cdiv, InterpretedFunction) != interpreter_enabled()


def _qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: bool, names: tuple[str, str, str]) -> None:
    rank = 3 if packed else 4
    layout = "(total, nheads, headdim)" if packed else "(batch, seqlen, nheads, headdim)"
    q_name, k_name, v_name = names
    for name, t in zip(names, (q, k, v)):
        _tensor(name, t)
        if t.dim() != rank:
            raise ValueError(f"{name} must have rank {rank} {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; flashtile supports float16, bfloat16 and float32")
    for name, t in ((k_name, k), (v_name, v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {q_name} has {q.dtype}; they must match")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but {q_name} is on {q.device}; they must share a device")
    if q.device.type != "cuda" and not interpreter_enabled():
        late = " (it was set only after flashtile loaded)" if os.environ.get("TRITON_INTERPRET") == "1" else ""
        raise ValueError(f"q is on {q.device}: flashtile needs a CUDA device (or TRITON_INTERPRET=1 for the "
                         f"Triton interpreter on the CPU, set before triton is imported{late})")
    if interpreter_enabled() and _interpreter_loaded_late():
        raise RuntimeError("TRITON_INTERPRET=1 was set after triton was imported, so its kernels cannot run under "
                           "the interpreter: set it before the first import of triton (or of torch._inductor)")
    if not packed and not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"{k_name} and {v_name} must agree on all but the head dim: {k_name} {tuple(k.shape)}, "
                         f"{v_name} {tuple(v.shape)}")
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        raise ValueError(f"head dims differ: {q_name} {head_dim}, {k_name} {k.shape[-1]}, {v_name} {v.shape[-1]}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"{q_name} has head dim {head_dim}; flashtile supports 1 to {MAX_HEAD_DIM}")
    nheads, nheads_k = q.shape[-2], k.shape[-2]
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"{q_name} has {nheads} heads, not a multiple of {k_name}'s {nheads_k} (GQA/MQA needs one)")


def softmax_scale(scale: Optional[float], head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a real number, got {type(scale).__name__}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale must be finite and positive, got {scale}")
    return float(scale)


def window(window_size: tuple[int, int], causal: bool) -> tuple[int, int]:
    """flash-attn's (left, right) window, -1 for unbounded; causal caps right at 0."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if type(window_size) is tuple and window_size == (-1, -1):
        return (-1, 0 if causal else -1)
    if isinstance(window_size, torch.Tensor):  # flash-attn's tests pass torch.randint(0, n, (2,))
        if window_size.shape != (2,):
            raise TypeError(f"window_size must be a pair (left, right), got a tensor of shape "
                            f"{tuple(window_size.shape)}")
        window_size = tuple(window_size.tolist())  # one read back to the host
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    left, right = host_int("window_size left", left), host_int("window_size right", right)
    for side, w in (("left", left), ("right", right)):
        if w < -1:
            raise ValueError(f"window_size {side} must be >= -1 (-1: unbounded), got {w}")
    return (left, 0 if causal else right)


def _host_checks_allowed(*values: object) -> bool:
    """Whether to check index values (set_value_checks): where every tensor among ``values`` is on the host, or in
    the debug mode, and never while tracing or capturing a CUDA graph."""
    if _value_checks is False or torch.compiler.is_compiling():
        return False
    on_gpu = [v for v in values if isinstance(v, torch.Tensor) and v.is_cuda]
    if not on_gpu:
        return True
    return _value_checks is True and not torch.cuda.is_current_stream_capturing()


def cu_seqlens(name: str, cu: torch.Tensor, total: int, max_seqlen: Union[int, torch.Tensor], max_name: str,
               device: torch.device) -> int:
    """int32 offsets [batch + 1]: start at 0, never decrease, end within the packed tensor. Returns max_seqlen as
    an int (flash-attn also takes it as a 0-d tensor)."""
    _tensor(name, cu)
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be a 1-D tensor of batch + 1 offsets, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}")
    max_seqlen = host_int(max_name, max_seqlen)
    if max_seqlen < 0:
        raise ValueError(f"{max_name} must be >= 0, got {max_seqlen}")
    if not _host_checks_allowed(cu):
        return max_seqlen
    offsets = cu.tolist()
    if offsets[0] != 0:
        raise ValueError(f"{name} must start at 0, got {offsets[0]}")
    lengths = [b - a for a, b in zip(offsets, offsets[1:])]
    if any(n < 0 for n in lengths):
        raise ValueError(f"{name} must be non-decreasing, got {offsets}")
    if offsets[-1] > total:
        raise ValueError(f"{name} ends at {offsets[-1]}, beyond the {total} packed tokens")
    if lengths and max(lengths) > max_seqlen:
        raise ValueError(f"{max_name}={max_seqlen} is smaller than the longest sequence ({max(lengths)})")
    return max_seqlen


def int32_vector(name: str, t: torch.Tensor, length: int, device: torch.device) -> None:
    _tensor(name, t)
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")


_KVCACHE_PASSED = {}  # the signature of every argument set whose shapes and types passed -> (paged, capacity)


def kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
            v: Optional[torch.Tensor], cache_seqlens: Union[int, torch.Tensor, None],
            cache_batch_idx: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
            cache_leftpad: Optional[torch.Tensor] = None,
            rotary_rows: Optional[int] = None, rotary_span: int = 0) -> tuple[bool, int]:
    """Shapes, dtypes and (outside tracing) values of flash_attn_with_kvcache's arguments; with ``rotary_rows``
    (rows of rotary_cos), also that the ``rotary_span`` positions from cache_seqlens[b] on exist there.
    Returns (paged, capacity): capacity = keys one sequence's cache can hold. A decode loop passes the same
    shapes every step, so the shape and type checks run once per signature; the value checks run on every
    call while they are on."""
    key = (_signature(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, cache_leftpad),
           interpreter_enabled())
    known = _KVCACHE_PASSED.get(key)
    if known is None:
        known = _kvcache_structure(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table)
        if cache_leftpad is not None:
            int32_vector("cache_leftpad", cache_leftpad, q.shape[0], q.device)
        if len(_KVCACHE_PASSED) >= 1024:
            _KVCACHE_PASSED.clear()
        _KVCACHE_PASSED[key] = known
    if _host_checks_allowed(cache_seqlens, cache_batch_idx, block_table, cache_leftpad):
        lengths = _kvcache_values(q, k_cache, k, cache_seqlens, cache_batch_idx, block_table, cache_leftpad,
                                  known[1])
        if rotary_rows is not None and max(lengths) + rotary_span > rotary_rows:
            raise ValueError(f"rotary_cos/rotary_sin have {rotary_rows} positions; the new tokens take positions "
                             f"up to {max(lengths) + rotary_span - 1} (cache_seqlens {lengths})")
    return known


def rotary(cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], interleaved: bool, q: torch.Tensor,
           k: Optional[torch.Tensor], per_token: bool) -> tuple[Optional[int], int]:
    """rotary_cos and rotary_sin (seqlen_ro, rotary_dim / 2), given together and only with new k, v. Returns
    (rows of the table, positions the new tokens take from cache_seqlens[b] on: the queries one each when
    ``per_token``, else all the first), or (None, 0) without them."""
    if cos is None and sin is None:
        return None, 0
    if cos is None or sin is None:
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if k is None:
        raise ValueError("rotary_cos and rotary_sin turn the new tokens: pass k and v as well")
    _tensor("q", q)
    _tensor("k", k)
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        _tensor(name, t)
        if t.dim() != 2:
            raise ValueError(f"{name} must be (seqlen_ro, rotary_dim / 2), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; float16, bfloat16 or float32 expected")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    if cos.shape != sin.shape:
        raise ValueError(f"rotary_cos {tuple(cos.shape)} and rotary_sin {tuple(sin.shape)} must match")
    if not 1 <= cos.shape[1] <= q.shape[-1] // 2:
        raise ValueError(f"rotary_dim = 2 x rotary_cos.shape[1] = {2 * cos.shape[1]} must lie in [2, headdim = "
                         f"{q.shape[-1]}]")
    if not isinstance(interleaved, bool):
        raise TypeError(f"rotary_interleaved must be a bool, got {type(interleaved).__name__}")
    return cos.shape[0], max(q.shape[1] if per_token else 1, k.shape[1])


def page_table(table: torch.Tensor, batch: int, device: torch.device) -> None:
    """A page table: int32 (batch, max_pages) on ``device``."""
    _tensor("block_table", table)
    if table.dtype != torch.int32:
        raise TypeError(f"block_table must be int32, got {table.dtype}")
    if table.dim() != 2 or table.shape[0] != batch:
        raise ValueError(f"block_table must be (batch={batch}, max_pages), got {tuple(table.shape)}")
    if table.device != device:
        raise ValueError(f"block_table must be on {device}, got {table.device}")


def _kvcache_structure(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                       v: Optional[torch.Tensor], cache_seqlens: Union[int, torch.Tensor, None],
                       cache_batch_idx: Optional[torch.Tensor],
                       block_table: Optional[torch.Tensor]) -> tuple[bool, int]:
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _tensor(name, t)
        if t.dim() != 4 or t.shape[0] == 0:
            raise ValueError(f"{name} must have rank 4 and a non-empty first dim, got shape {tuple(t.shape)}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must match")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:  # written in place and read as rows: no contiguous copy can stand in for it
            raise ValueError(f"{name} must have a contiguous last dimension, got strides {t.stride()}")
    if k_cache.shape[2] == 0 or q.shape[2] % k_cache.shape[2] != 0:
        raise ValueError(f"q has {q.shape[2]} heads, not a multiple of k_cache's {k_cache.shape[2]}: k_cache and "
                         "v_cache are (batch_cache, seqlen_cache, nheads_k, headdim), as in flash-attn; a head-major "
                         "(batch, nheads_k, seqlen, headdim) cache goes in as k_cache.transpose(1, 2)")
    # the cache's first dim (sequences or pages) need not be q's batch: check the rest against a stand-in
    qkv(q, k_cache[:1].expand(q.shape[0], *k_cache.shape[1:]), v_cache[:1].expand(q.shape[0], *v_cache.shape[1:]),
        packed=False, names=("q", "k_cache", "v_cache"))
    batch = q.shape[0]
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (the new tokens to append)")
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            _tensor(name, t)
            if t.dim() != 4 or t.shape[0] != batch or t.shape[2:] != k_cache.shape[2:]:
                raise ValueError(f"{name} must be (batch={batch}, seqlen_new, nheads_k={k_cache.shape[2]}, "
                                 f"headdim={k_cache.shape[3]}), got {tuple(t.shape)}")
            if t.dtype != k_cache.dtype or t.device != q.device:
                raise TypeError(f"{name} must match k_cache's dtype {k_cache.dtype} and q's device")
        if k.shape[1] != v.shape[1]:
            raise ValueError(f"k and v hold {k.shape[1]} and {v.shape[1]} new tokens; they must agree")
        if cache_seqlens is None:
            raise ValueError("cache_seqlens is needed to know where k and v are appended")
    if block_table is not None:
        page_table(block_table, batch, q.device)
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx cannot be combined with a paged cache (block_table)")
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if cache_batch_idx is not None:
            int32_vector("cache_batch_idx", cache_batch_idx, batch, q.device)
        elif k_cache.shape[0] != batch:
            raise ValueError(f"k_cache holds {k_cache.shape[0]} sequences but q has batch {batch}; "
                             "pass cache_batch_idx to pick them")
        capacity = k_cache.shape[1]
    if isinstance(cache_seqlens, torch.Tensor):
        int32_vector("cache_seqlens", cache_seqlens, batch, q.device)
    elif cache_seqlens is not None and (isinstance(cache_seqlens, bool)
                                        or not isinstance(cache_seqlens, numbers.Integral)):
        raise TypeError(f"cache_seqlens must be an int or an int32 tensor, got {type(cache_seqlens).__name__}")
    return block_table is not None, capacity


def _kvcache_values(q: torch.Tensor, k_cache: torch.Tensor, k: Optional[torch.Tensor],
                    cache_seqlens: Union[int, torch.Tensor, None],
                    cache_batch_idx: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                    cache_leftpad: Optional[torch.Tensor], capacity: int) -> list[int]:
    """Every value check in one device-to-host copy: the lengths, then a flag per index table. Returns the
    lengths."""
    batch, seqlen_new = q.shape[0], 0 if k is None else k.shape[1]
    tables = [t for t in (cache_seqlens, block_table, cache_batch_idx, cache_leftpad) if isinstance(t, torch.Tensor)]
    device = tables[0].device if tables else torch.device("cpu")  # ints: checked without touching the GPU
    if isinstance(cache_seqlens, torch.Tensor):
        lengths = cache_seqlens.long()
    else:
        fill = capacity - seqlen_new if cache_seqlens is None else int(cache_seqlens)
        lengths = torch.full((batch,), fill, dtype=torch.long, device=device)
    flags = []
    if block_table is not None:
        needed = (lengths + seqlen_new + k_cache.shape[1] - 1) // k_cache.shape[1]  # pages each sequence uses
        used = torch.arange(block_table.shape[1], device=device)[None, :] < needed[:, None]
        flags.append((((block_table < 0) | (block_table >= k_cache.shape[0])) & used).any())
    if cache_batch_idx is not None:
        flags.append(((cache_batch_idx < 0) | (cache_batch_idx >= k_cache.shape[0])).any())
    if cache_leftpad is not None:
        flags.append(((cache_leftpad < 0) | (cache_leftpad > lengths)).any())
    values = torch.cat([lengths, torch.stack(flags).long()]).tolist() if flags else lengths.tolist()
    lengths, flags = values[:batch], values[batch:]
    if min(lengths) < 0 or max(lengths) + seqlen_new > capacity:
        raise ValueError(f"cache_seqlens {lengths} plus {seqlen_new} new tokens must lie within the cache's "
                         f"{capacity} slots")
    if block_table is not None and flags.pop(0):
        raise ValueError(f"block_table holds page indices outside [0, {k_cache.shape[0]})")
    if cache_batch_idx is not None and flags.pop(0):
        raise ValueError(f"cache_batch_idx holds indices outside [0, {k_cache.shape[0]})")
    if cache_leftpad is not None and flags.pop(0):
        raise ValueError(f"cache_leftpad must lie in [0, cache_seqlens[b]] for every sequence b "
                         f"(cache_seqlens {lengths})")
    return lengths


def partials(out_partials: torch.Tensor, lse_partials: torch.Tensor) -> None:
    """combine's inputs: (splits, batch, seqlen, nheads, headdim) and float32 (splits, batch, nheads, seqlen)."""
    _tensor("out_partials", out_partials)
    _tensor("lse_partials", lse_partials)
    if out_partials.dim() != 5:
        raise ValueError(f"out_partials must be (splits, batch, seqlen, nheads, headdim), got "
                         f"{tuple(out_partials.shape)}")
    s, b, n, h, _ = out_partials.shape
    if lse_partials.shape != (s, b, h, n):
        raise ValueError(f"lse_partials must be (splits, batch, nheads, seqlen) = {(s, b, h, n)}, got "
                         f"{tuple(lse_partials.shape)}")
    if lse_partials.dtype != torch.float32:
        raise TypeError(f"lse_partials must be float32, got {lse_partials.dtype}")
    if out_partials.dtype not in DTYPES:
        raise TypeError(f"out_partials has dtype {out_partials.dtype}; float16, bfloat16 or float32 expected")
    if lse_partials.device != out_partials.device:
        raise ValueError("out_partials and lse_partials must share a device")
