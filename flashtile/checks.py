"""Every input check, run before any launch. Each failure names the argument that caused it."""
import math
import numbers
import os

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256


def interpreter_enabled():
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def not_implemented(**options):
    """Options flashtile does not implement yet must keep their neutral value."""
    neutral = {"dropout_p": 0.0, "softcap": 0.0, "alibi_slopes": None, "attn_mask": None}
    for name, value in options.items():
        if value is None and neutral[name] is None:
            continue
        if neutral[name] is None or value != neutral[name]:
            raise NotImplementedError(f"{name}={value!r} is not supported by flashtile yet")


def qkv(q, k, v, packed):
    """q, k, v as (batch, seqlen, nheads, headdim), or (total, nheads, headdim) when ``packed``."""
    rank = 3 if packed else 4
    layout = "(total, nheads, headdim)" if packed else "(batch, seqlen, nheads, headdim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _tensor(name, t)
        if t.dim() != rank:
            raise ValueError(f"{name} must have rank {rank} {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; flashtile supports float16, bfloat16 and float32")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; they must match")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; they must share a device")
    if q.device.type != "cuda" and not interpreter_enabled():
        raise ValueError(f"q is on {q.device}: flashtile needs a CUDA device (or TRITON_INTERPRET=1 for the "
                         "Triton interpreter on the CPU)")
    if not packed and not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must agree on all but the head dim: k {tuple(k.shape)}, v {tuple(v.shape)}")
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        raise ValueError(f"head dims differ: q {head_dim}, k {k.shape[-1]}, v {v.shape[-1]}")
    if not (MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM and head_dim % 8 == 0):
        raise ValueError(f"q has head dim {head_dim}; flashtile supports multiples of 8 from "
                         f"{MIN_HEAD_DIM} to {MAX_HEAD_DIM}")
    nheads, nheads_k = q.shape[-2], k.shape[-2]
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"q has {nheads} heads, not a multiple of k's {nheads_k} (GQA/MQA needs one)")


def softmax_scale(scale, head_dim):
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a real number, got {type(scale).__name__}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale must be finite and positive, got {scale}")
    return float(scale)


def window(window_size, causal):
    """flash-attn's (left, right) window, -1 for unbounded; causal caps right at 0."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    for side, w in (("left", left), ("right", right)):
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            raise TypeError(f"window_size {side} must be an int, got {w!r}")
        if w < -1:
            raise ValueError(f"window_size {side} must be >= -1 (-1: unbounded), got {w}")
    return (int(left), 0 if causal else int(right))


def _host_checks_allowed(t):
    """Value checks read the tensor on the host: skip them while tracing or capturing a CUDA graph."""
    if torch.compiler.is_compiling():
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def cu_seqlens(name, cu, total, max_seqlen, max_name, device):
    """int32 offsets [batch + 1]: start at 0, never decrease, end within the packed tensor."""
    _tensor(name, cu)
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be a 1-D tensor of batch + 1 offsets, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, numbers.Integral) or max_seqlen < 0:
        raise TypeError(f"{max_name} must be a non-negative int, got {max_seqlen!r}")
    if not _host_checks_allowed(cu):
        return
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
