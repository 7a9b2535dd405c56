"""Code written against the ``flash_attn`` package, on flashtile, without editing it (opt-in).

    import flashtile.integrations.flash_attn as shim
    shim.install()        # from here on `import flash_attn` gives flashtile's functions
    ...
    shim.uninstall()      # the modules that were there before (or none) come back

or ``with shim.installed(): ...``. The modules put in place: ``flash_attn`` (the seven entry points),
``flash_attn.flash_attn_interface`` (the same, and the ``_flash_attn_forward`` / ``_flash_attn_backward`` and
``_flash_attn_varlen_forward`` / ``_flash_attn_varlen_backward`` that ring-attention libraries call, with flash-attn
2.6-2.8's signatures), ``flash_attn.bert_padding`` (``unpad_input``,
``pad_input``) and ``flash_attn.layers.rotary`` (``apply_rotary_emb``, forward only). Dropout is not supported
(``dropout_p`` > 0 raises NotImplementedError, as everywhere in flashtile).
For transformers, use flashtile.integrations.transformers instead: transformers looks for the installed package.
"""
import contextlib
import sys
import types

import torch

from .. import api, checks, ops

_NAMES = ("flash_attn", "flash_attn.flash_attn_interface", "flash_attn.bert_padding", "flash_attn.layers",
          "flash_attn.layers.rotary")
_saved = None


def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
                        alibi_slopes, return_softmax):
    """flash-attn 2.6's forward kernel call: (out, softmax_lse, S_dmask, rng_state); no autograd."""
    checks.not_implemented(dropout_p=dropout_p)
    if return_softmax:
        raise NotImplementedError("return_softmax (the attention probabilities) is not supported by flashtile: "
                                  "its kernels never form them")
    window = checks.window((window_size_left, window_size_right), causal)
    scale = checks.softmax_scale(softmax_scale, q.shape[-1])
    with torch.no_grad():
        out, lse = ops.flash_attention(q, k, v, scale, window, True, softcap=softcap, alibi_slopes=alibi_slopes)
    return out, lse, None, None


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
                         window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state=None):
    """flash-attn 2.6's backward kernel call: dq, dk, dv written in place (by the kernels where they take them:
    contiguous, else copied); returns softmax_d (rowsum(dO ∘ O)), the delta the kernels computed."""
    checks.not_implemented(dropout_p=dropout_p)
    window = checks.window((window_size_left, window_size_right), causal)
    scale = checks.softmax_scale(softmax_scale, q.shape[-1])
    *grads, delta = ops.attention_backward(dout, q, k, v, out, softmax_lse, scale, window, True, deterministic,
                                           softcap=softcap, alibi_slopes=alibi_slopes, grads_out=(dq, dk, dv),
                                           return_delta=True)
    _copy_into((dq, dk, dv), grads)
    return delta


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                               softmax_scale, causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
                               alibi_slopes=None, return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None, zero_tensors=False):
    """flash-attn 2.6-2.8's packed-sequence forward kernel call: (out, softmax_lse (nheads, total_q), None, None); no
    autograd. ``block_table``: paged keys and values, as flash_attn_varlen_func takes them. ``zero_tensors`` changes
    nothing: the rows of out past the last sequence always come out 0 (ops.attention_forward)."""
    checks.not_implemented(dropout_p=dropout_p, leftpad_k=leftpad_k, seqused_k=seqused_k)
    if return_softmax:
        raise NotImplementedError("return_softmax (the attention probabilities) is not supported by flashtile: "
                                  "its kernels never form them")
    with torch.no_grad():
        out, lse, _ = api.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                 0.0, softmax_scale, causal, (window_size_left, window_size_right),
                                                 softcap, alibi_slopes, return_attn_probs=True,
                                                 block_table=block_table)
    return out, lse, None, None


def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left,
                                window_size_right, softcap, alibi_slopes, deterministic, rng_state=None,
                                zero_tensors=False):
    """flash-attn 2.6-2.8's packed-sequence backward kernel call: dq, dk, dv written in place as _flash_attn_backward
    writes them (rows of no sequence get 0); returns softmax_d (nheads, total_q), the delta the kernels computed."""
    checks.not_implemented(dropout_p=dropout_p)
    window = checks.window((window_size_left, window_size_right), causal)
    scale = checks.softmax_scale(softmax_scale, q.shape[-1])
    *grads, delta = ops.attention_backward(dout, q, k, v, out, softmax_lse, scale, window, True, deterministic,
                                           cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                                           softcap=softcap, alibi_slopes=alibi_slopes, grads_out=(dq, dk, dv),
                                           return_delta=True)
    _copy_into((dq, dk, dv), grads)
    return delta


def _copy_into(targets, grads):
    """The gradients into the caller's buffers the kernels could not write (strided ones)."""
    for target, grad in zip(targets, grads):
        if target is not None and target is not grad:
            target.copy_(grad)


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """flash_attn.bert_padding.unpad_input: (rows where attention_mask (batch, seqlen) is set, indices into the
    flattened rows, int32 cu_seqlens, the longest sequence, each sequence's length)."""
    mask = attention_mask.bool() if unused_mask is None else (attention_mask.bool() | unused_mask.bool())
    used = attention_mask.sum(-1, dtype=torch.int32)
    lengths = mask.sum(-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten()).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    rows = hidden_states.reshape(-1, *hidden_states.shape[2:])[indices]
    return rows, indices, cu_seqlens, int(lengths.max()), used


def pad_input(hidden_states, indices, batch, seqlen):
    """flash_attn.bert_padding.pad_input: the rows back at their indices of (batch, seqlen, ...), zeros elsewhere."""
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """flash_attn.layers.rotary.apply_rotary_emb on x (batch, seqlen, nheads, headdim): the first 2 · cos.shape[1]
    features of token t of sequence b turned by the angles of cos, sin (seqlen_ro, rotary_dim / 2) at position
    seqlen_offsets + t (an int, or a (batch,) tensor of each sequence's offset), the rest kept (ops.rotary, one
    launch). No gradient flows through it, and packed sequences (cu_seqlens) are not supported: both raise."""
    if cu_seqlens is not None:
        raise NotImplementedError("apply_rotary_emb on packed sequences (cu_seqlens) is not supported by flashtile")
    if torch.is_grad_enabled() and x.requires_grad:
        raise NotImplementedError("flashtile's apply_rotary_emb has no backward; call it under torch.no_grad()")
    offsets = (seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor)
               else torch.full((x.shape[0], ), seqlen_offsets, device=x.device))
    out = ops.rotary(x, cos, sin, offsets.to(torch.int32), True, interleaved)
    return x.copy_(out) if inplace else out


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """flash-attn's key-block size, which its tests use to decode the dropout mask a call returned: flashtile returns
    no mask (it has no dropout), so there is nothing to decode."""
    raise NotImplementedError("flashtile has no dropout and returns no dropout mask to decode")


def _module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs, __doc__=f"flashtile standing in for {name} (flashtile.integrations.flash_attn)")
    return module


def install():
    """Puts flashtile's ``flash_attn`` modules in sys.modules (idempotent); uninstall() undoes it."""
    global _saved
    if _saved is not None:
        return
    entry = dict(flash_attn_func=api.flash_attn_func, flash_attn_varlen_func=api.flash_attn_varlen_func,
                 flash_attn_qkvpacked_func=api.flash_attn_qkvpacked_func,
                 flash_attn_kvpacked_func=api.flash_attn_kvpacked_func,
                 flash_attn_varlen_qkvpacked_func=api.flash_attn_varlen_qkvpacked_func,
                 flash_attn_varlen_kvpacked_func=api.flash_attn_varlen_kvpacked_func,
                 flash_attn_with_kvcache=api.flash_attn_with_kvcache)
    interface = _module("flash_attn.flash_attn_interface", _flash_attn_forward=_flash_attn_forward,
                        _flash_attn_backward=_flash_attn_backward,
                        _flash_attn_varlen_forward=_flash_attn_varlen_forward,
                        _flash_attn_varlen_backward=_flash_attn_varlen_backward,
                        _get_block_size_n=_get_block_size_n, **entry)
    padding = _module("flash_attn.bert_padding", unpad_input=unpad_input, pad_input=pad_input)
    rotary = _module("flash_attn.layers.rotary", apply_rotary_emb=apply_rotary_emb)
    layers = _module("flash_attn.layers", rotary=rotary, __path__=[])
    package = _module("flash_attn", flash_attn_interface=interface, bert_padding=padding, layers=layers,
                      __version__="2.6.3", __path__=[], **entry)
    _saved = {name: sys.modules.get(name) for name in _NAMES}
    sys.modules.update(zip(_NAMES, (package, interface, padding, layers, rotary)))


def uninstall():
    """Restores the modules (or their absence) that install() found."""
    global _saved
    if _saved is None:
        return
    for name, module in _saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
    _saved = None


@contextlib.contextmanager
def installed():
    """install() for the duration of a with block."""
    install()
    try:
        yield
    finally:
        uninstall()
