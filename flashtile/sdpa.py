"""flashtile behind PyTorch's own attention: F.scaled_dot_product_attention's flash path, and
torch.nn.attention.varlen (which calls the same ops), run on flashtile's kernels. Never on by import.

    import flashtile.sdpa
    flashtile.sdpa.enable()        # or: with flashtile.sdpa.enabled(): ...
    flashtile.sdpa.restore()       # PyTorch's own flash kernels again

It goes through PyTorch's registry of flash implementations (torch.nn.attention.register_flash_attention_impl,
the way PyTorch plugs in FA4): CUDA kernels for aten's ``_scaled_dot_product_flash_attention``, ``_flash_attention_
forward`` and their backwards. Their outputs are what PyTorch (and its context parallelism) expects from those ops:
out, and a float32 LSE (batch, nheads, seqlen) or (nheads, total) in natural log. SDPA picks its flash path only for
the calls it admits (fp16/bf16, no attn_mask, no dropout...); dropout and seqused_k raise NotImplementedError here.
"""
import contextlib
import math

import torch
from torch.library import Library

from . import checks, ops

NAME = "flashtile"
OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
       "_flash_attention_forward", "_flash_attention_backward")


def _window(left, right, causal):
    """aten's window bounds (None or negative: unbounded) as flashtile's (left, right)."""
    left, right = (-1 if v is None or v < 0 else int(v) for v in (left, right))
    return (left, 0) if causal else (left, right)


def _refuse(dropout_p=0.0, seqused_k=None, alibi_slopes=None, block_table=None):
    checks.not_implemented(dropout_p=dropout_p)
    for name, value in (("seqused_k", seqused_k), ("alibi_slopes", alibi_slopes), ("block_table", block_table)):
        if value is not None:
            raise NotImplementedError(f"{name} is not supported by flashtile's aten flash kernels; "
                                      f"flashtile.sdpa.restore() gives PyTorch's own back")


def _aux(device):
    """rng_state, the unused philox offset and the empty debug mask PyTorch's flash forward also returns."""
    return (torch.zeros(2, dtype=torch.uint64, device=device), torch.zeros((), dtype=torch.uint64, device=device),
            torch.empty(0, device=device))


def _forward(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, scale, window, bottom_right, heads_first_out=False):
    """(out, lse) without autograd: the op's own autograd formula calls the backward op."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    packed = cum_seq_q is not None
    cu = (cum_seq_q.to(torch.int32), cum_seq_k.to(torch.int32)) if packed else (None, None)
    with torch.no_grad():
        return ops.flash_attention(q, k, v, scale, window, bottom_right, heads_first_out=heads_first_out,
                                   cu_seqlens_q=cu[0], cu_seqlens_k=cu[1], max_seqlen_q=int(max_q) if packed else 0,
                                   max_seqlen_k=int(max_k) if packed else 0)


def _backward(dout, q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q, max_k, scale, window, bottom_right):
    head_dim = q.shape[-1]
    scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    packed = cum_seq_q is not None and cum_seq_q.numel() > 0
    cu = (cum_seq_q.to(torch.int32), cum_seq_k.to(torch.int32)) if packed else (None, None)
    dout, q, k, v, out = ops.pad_head_dim(dout, q, k, v, out)
    grads = ops.attention_backward(dout, q, k, v, out, lse, scale, window, bottom_right,
                                   torch.are_deterministic_algorithms_enabled(), cu[0], cu[1],
                                   int(max_q) if packed else None, int(max_k) if packed else None)
    return tuple(g[..., :head_dim] for g in grads)


def sdpa_flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """aten._scaled_dot_product_flash_attention: (batch, nheads, seqlen, headdim) in and out; causal top-left."""
    _refuse(dropout_p)
    if return_debug_mask:
        raise NotImplementedError("return_debug_mask is not supported by flashtile: its kernels never form P")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out, lse = _forward(q, k, v, None, None, 0, 0, scale, (-1, 0) if is_causal else (-1, -1), False,
                        heads_first_out=True)
    rng_state, unused, debug = _aux(query.device)
    return (out.transpose(1, 2), lse, None, None, query.shape[2], key.shape[2], rng_state, unused, debug)


def sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                        is_causal, philox_seed, philox_offset, *, scale=None):
    """aten._scaled_dot_product_flash_attention_backward: (dq, dk, dv) shaped like query, key, value."""
    _refuse(dropout_p)
    tensors = (t.transpose(1, 2) for t in (grad_out, query, key, value, out))
    grads = _backward(*tensors, logsumexp, None, None, 0, 0, scale, (-1, 0) if is_causal else (-1, -1), False)
    return tuple(g.transpose(1, 2) for g in grads)


def flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
                  scale=None, window_size_left=None, window_size_right=None, seqused_k=None, alibi_slopes=None,
                  block_table=None, num_splits=None, **_):
    """aten._flash_attention_forward: (batch, seqlen, nheads, headdim), or packed (total, nheads, headdim) with
    cum_seq_q/k; causal bottom-right, as flash-attn."""
    _refuse(dropout_p, seqused_k, alibi_slopes, block_table)
    if return_debug_mask:
        raise NotImplementedError("return_debug_mask is not supported by flashtile: its kernels never form P")
    out, lse = _forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, scale,
                        _window(window_size_left, window_size_right, is_causal), True)
    return (out, lse, *_aux(query.device))


def flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                   is_causal, rng_state, unused, *, scale=None, window_size_left=None, window_size_right=None, **_):
    """aten._flash_attention_backward: (dq, dk, dv)."""
    _refuse(dropout_p)
    return _backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, scale,
                     _window(window_size_left, window_size_right, is_causal), True)


class _Handle:
    """Keeps the registrations alive; remove() takes them back (PyTorch's kernels serve again)."""

    def __init__(self, library):
        self.library = library

    def remove(self):
        if self.library is not None:
            self.library._destroy()
            self.library = None


def register_kernels(dispatch_key="CUDA"):
    """Registers the four ops' kernels for ``dispatch_key`` (tests use "CPU"); returns the handle that removes them."""
    library = Library("aten", "IMPL", dispatch_key)
    for name, fn in zip(OPS, (sdpa_flash_forward, sdpa_flash_backward, flash_forward, flash_backward)):
        library.impl(name, fn, dispatch_key)
    return _Handle(library)


_registry = getattr(torch.nn.attention, "register_flash_attention_impl", None)
_active = None  # the handle, where torch has no registry of flash implementations
if _registry is not None:
    _registry(NAME, register_fn=register_kernels)


def enable():
    """Routes PyTorch's flash attention ops to flashtile (idempotent) until restore()."""
    global _active
    if _registry is not None:
        torch.nn.attention.activate_flash_attention_impl(NAME)
    elif _active is None:
        _active = register_kernels()


def restore():
    """PyTorch's own flash kernels again."""
    global _active
    if _registry is not None:
        if torch.nn.attention.current_flash_attention_impl() == NAME:
            torch.nn.attention.restore_flash_attention_impl()
    elif _active is not None:
        _active.remove()
        _active = None


def is_enabled():
    if _registry is not None:
        return torch.nn.attention.current_flash_attention_impl() == NAME
    return _active is not None


@contextlib.contextmanager
def enabled():
    """enable() for the duration of a with block, then restore()."""
    enable()
    try:
        yield
    finally:
        restore()
