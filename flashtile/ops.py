"""Operations on checked inputs: prepare the tensors, pick the tile config, launch the kernel."""
import torch
import triton

from . import configs
from .checks import interpreter_enabled
from .kernels.fwd import launch_fwd

_TMA_ALIGN = 16  # bytes: base address and every stride but the last of a TMA descriptor


def _tma_ready(t):
    """``t`` itself when a tensor descriptor can address it, else a fresh contiguous copy."""
    size = t.element_size()
    aligned = t.stride(-1) == 1 and all((s * size) % _TMA_ALIGN == 0 for s in t.stride()[:-1])
    if aligned and t.data_ptr() % _TMA_ALIGN == 0:
        return t
    return t.contiguous() if not t.is_contiguous() else t.clone()


def _ensure_allocator():
    """On-device tensor descriptors need scratch memory from Triton's allocator; set one if none is."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def _arch(device):
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def _config(q, causal):
    head_dim_pad = max(32, triton.next_power_of_2(q.shape[-1]))
    return configs.fwd_config(head_dim_pad, causal, q.element_size(), _arch(q.device), interpreter_enabled())


def attention_forward(q, k, v, softmax_scale, window_size, bottom_right, out=None,
                      cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, config=None):
    """Forward attention. q (batch, seqlen_q, nheads, headdim) or packed (total_q, nheads, headdim) with
    ``cu_seqlens_q``; ``out`` may be given as any strided view of that shape. Returns (out, lse), lse
    float32 (batch, nheads, seqlen_q) or (nheads, total_q), natural log. ``config`` overrides the tile
    config (the tile sweep uses it)."""
    nheads = q.shape[-2]
    if cu_seqlens_q is not None:
        seqlen_k = max_seqlen_k
        lse = torch.empty(nheads, q.shape[0], device=q.device, dtype=torch.float32)
    else:
        seqlen_k = k.shape[1]
        lse = torch.empty(q.shape[0], nheads, q.shape[1], device=q.device, dtype=torch.float32)
    if out is None:
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    if out.numel() == 0:
        return out, lse
    if seqlen_k == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    o = _tma_ready(out)
    if q.device.type == "cuda":
        _ensure_allocator()
    causal = window_size[1] == 0 and window_size[0] < 0
    launch_fwd(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window_size,
               bottom_right, config or _config(q, causal))
    if o is not out:
        out.copy_(o)
    return out, lse
