"""torch.library ops over the kernels, with autograd: ``flashtile::fwd`` and ``flashtile::bwd``.

They take checked inputs (``api`` checks them), prepare tensors for the tensor descriptors, pick the
tile config and launch. Being custom ops with fake implementations, they trace under torch.compile
as single nodes, without graph breaks.
"""
from typing import Callable, Optional

import torch
import torch.nn.functional as F
import triton
from torch import Tensor

from . import configs, dispatch
from .kernels.common.replay import Kept, launch_key, stream_handle
from .kernels.common.tiles import tma_addressable
from .kernels.portable.bwd import launch_bwd, launch_preprocess
from .kernels.portable.decode import arrival_slots, launch_combine, launch_decode, partial_elements
from .kernels.portable.fwd import launch_again as launch_fwd_again
from .kernels.portable.fwd import launch_fwd
from .kernels.portable.new_tokens import launch_append, launch_rotary
from .kernels.portable.packed import launch_safe_offsets, launch_zero_unused_grads, launch_zero_unused_rows


def _unit_last_stride(t: Optional[Tensor]) -> Optional[Tensor]:
    """``t`` (or None) with its last dimension contiguous, as the pointer-indexed kernels read it."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def _tma_ready(t: Tensor) -> Tensor:
    """``t`` itself when a tensor descriptor can address it, else a fresh contiguous copy."""
    if tma_addressable(t):
        return t
    return t.contiguous() if not t.is_contiguous() else t.clone()


def _ensure_allocator(device: torch.device) -> None:
    """On-device tensor descriptors (varlen) need scratch memory from Triton's allocator; set one if none is."""
    from triton.runtime import _allocation

    if device.type == "cuda" and isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def _new_out(q: Tensor, heads_first: bool) -> Tensor:
    """O shaped like q; ``heads_first`` stores it as (batch, nheads, seqlen, headdim), SDPA's layout."""
    if heads_first:
        b, n, h, d = q.shape
        return torch.empty(b, h, n, d, device=q.device, dtype=q.dtype).transpose(1, 2)
    return torch.empty(q.shape, device=q.device, dtype=q.dtype)


def _new_lse(q: Tensor, packed: bool) -> Tensor:
    shape = (q.shape[1], q.shape[0]) if packed else (q.shape[0], q.shape[2], q.shape[1])
    return torch.empty(shape, device=q.device, dtype=torch.float32)


def attention_forward(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, window_size: tuple[int, int],
                      bottom_right: bool, out: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
                      cu_seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                      max_seqlen_k: Optional[int] = None, config: object = None, softcap: float = 0.0,
                      alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Forward attention into ``out`` (any strided tensor shaped like q, or a new one). Returns (out, lse),
    lse float32 (batch, nheads, seqlen_q) or (nheads, total_q), natural log. ``config`` overrides the tile
    config (the tile sweep uses it). ``softcap``, ``alibi_slopes``: flash-attn's (ALiBi: the portable kernel). ``sinks``
    (float32 (nheads,), contiguous): a learned logit per head that joins each row's softmax denominator only (gpt-oss's
    attention sinks); the LSE counts it."""
    packed = cu_seqlens_q is not None
    lse = _new_lse(q, packed)
    out = _new_out(q, False) if out is None else out
    seqlen_k = max_seqlen_k if packed else k.shape[1]
    if out.numel() == 0:
        return out, lse
    if seqlen_k == 0:  # no key: O = 0, LSE = the sink (-inf without one)
        out.zero_()
        if sinks is None:
            return out, lse.fill_(float("-inf"))
        lse.copy_(sinks[:, None])
        if packed:  # rows past the last sequence keep -inf
            launch_zero_unused_rows(out, launch_safe_offsets(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0])[0],
                                    lse)
        return out, lse
    plain = not packed and config is None and not softcap and alibi_slopes is None
    key = None
    if plain and _FORWARD_AGAIN:
        key = _forward_key(q, k, v, out, sinks, softmax_scale, window_size, bottom_right)
        kept = _FORWARD_AGAIN.get(key, _forward_tables())
        if kept is not None and kept[0](kept[1], q, k, v, out, lse, sinks):
            return out, lse
    if packed:  # offsets no kernel can read out of bounds with, whatever their values
        cu_seqlens_q, cu_seqlens_k = launch_safe_offsets(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0])
    if config is None:
        plan = dispatch.forward(q, k, v, window_size, max_seqlen_q if packed else q.shape[1], softcap, alibi_slopes)
    else:
        plan = dispatch.Plan("hopper/fwd.py" if isinstance(config, configs.HopperFwdConfig) else "portable/fwd.py",
                             config)
    found = [] if plain else None
    if plan.kernel == "hopper/fwd.py":
        fwd_launch = dispatch.hopper("fwd_launch")
        fwd_launch.launch_fwd_hopper(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale,
                                     window_size, bottom_right, plan.config, sinks, found, softcap)
        again = fwd_launch.launch_again
    else:
        _portable_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window_size,
                          bottom_right, plan.config, softcap, alibi_slopes, sinks, found)
        again = launch_fwd_again
    if found and found[0] is not None:
        key = key or _forward_key(q, k, v, out, sinks, softmax_scale, window_size, bottom_right)
        _FORWARD_AGAIN.put(key, (again, found[0]), _forward_tables())
    if packed:  # rows past the last sequence
        launch_zero_unused_rows(out, cu_seqlens_q, lse)
    return out, lse


# The forward's launch function and what it launches again (the sm90 replay and its counter, or the portable
# replay) by the launch key of a plain batch-mode call (no softcap, ALiBi or config given): a training loop's later
# steps launch it without the dispatch, checks and launch key of the first.
_FORWARD_AGAIN = Kept()


def _forward_tables() -> tuple:
    """The config tables a plain forward's dispatch reads (the sm90 chains, then the portable tiles)."""
    return configs.FWD_HOPPER, configs.FWD_SM90, configs.FWD_FP32, configs.FWD_GENERIC, configs.FWD_INTERPRETER


def _forward_key(q: Tensor, k: Tensor, v: Tensor, out: Tensor, sinks: Optional[Tensor], softmax_scale: float,
                 window_size: tuple[int, int], bottom_right: bool) -> tuple:
    """A plain forward call's key in _FORWARD_AGAIN: its tensors' launch key, its arguments and the backend dispatch
    reads (its config tables are checked by identity: _forward_tables)."""
    return launch_key((q, k, v, out, sinks), softmax_scale, window_size, bottom_right, configs.FWD_BACKEND)


def _portable_forward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
                      cu_seqlens_k: Optional[Tensor], max_seqlen_q: Optional[int], softmax_scale: float,
                      window_size: tuple[int, int], bottom_right: bool, config: object, softcap: float,
                      alibi_slopes: Optional[Tensor], sinks: Optional[Tensor], found: Optional[list] = None) -> None:
    """kernels/portable/fwd.py into ``out`` and ``lse``, through TMA-ready copies where the tensors are not. ``found``
    (a list, or None) gets the launch's replay where no copy was made (a replay takes the call's own tensors)."""
    packed = cu_seqlens_q is not None
    inputs = (q, k, v, out)
    q, k, v, o = (_tma_ready(t) for t in inputs)
    if packed:
        _ensure_allocator(q.device)
    if found is not None and not all(a is b for a, b in zip(inputs, (q, k, v, o))):
        found = None
    launch_fwd(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, window_size, bottom_right,
               config, softcap, _unit_last_stride(alibi_slopes), sinks, found)
    if o is not out:
        out.copy_(o)


def attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, softmax_scale: float,
                       window_size: tuple[int, int], bottom_right: bool, deterministic: bool,
                       cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None,
                       max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None, config: object = None,
                       softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, dlse: Optional[Tensor] = None,
                       sinks: Optional[Tensor] = None, grads_out: tuple = (None, None, None),
                       return_delta: bool = False) -> tuple[Tensor, ...]:
    """Gradients (dq, dk, dv), shaped like q, k, v. ``deterministic`` computes dQ in its own pass, with
    no atomics, so that every gradient is bitwise reproducible. ``dlse`` (shaped like lse, or None) is the
    gradient reaching the LSE: since d lse_i / d s_ij = P_ij, it enters as delta − dlse wherever delta does.
    ``sinks`` (float32 (nheads,), the forward's): their gradient follows, float32 (nheads,) (sink_grad, summed from
    parts the delta launch writes). ``grads_out``: tensors the gradients may be written into (each used where it is
    contiguous, 16-byte aligned and shaped like its input, else a new one); ``return_delta`` appends the float32
    delta (rowsum(dO ∘ O) − dlse, shaped like lse) that the kernels used."""
    plain = (cu_seqlens_q is None and config is None and not softcap and alibi_slopes is None and dlse is None
             and sinks is None and grads_out[0] is None and grads_out[1] is None and grads_out[2] is None)
    if plain and _ONE_PASS:
        found = _ONE_PASS.get(_one_pass_key(dout, q, k, v, out, lse, softmax_scale, window_size, bottom_right,
                                            deterministic), (configs.BWD_HOPPER, ))
        if found is not None:
            return _one_pass_again(found, dout, q, k, v, out, lse, softmax_scale, window_size, bottom_right,
                                   return_delta)
    dq, dk, dv = (g if _writable_like(g, t) else torch.empty(t.shape, device=t.device, dtype=t.dtype)
                  for g, t in zip(grads_out, (q, k, v)))
    seqlen_k = max_seqlen_k if cu_seqlens_q is not None else k.shape[1]
    if q.numel() == 0 or k.numel() == 0 or seqlen_k == 0:
        for grad in (dq, dk, dv):
            grad.zero_()
        delta = torch.zeros_like(lse) if dlse is None else -dlse.float()  # O = 0
        dsinks = None if sinks is None else sink_grad(sinks, lse, delta)
    else:
        delta, sink_parts = _launch_backward(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, window_size,
                                             bottom_right, deterministic, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                             max_seqlen_k, config, softcap, alibi_slopes, dlse, sinks, plain)
        dsinks = None if sinks is None else sink_parts.sum(1)
    return (dq, dk, dv) + (() if sinks is None else (dsinks, )) + ((delta, ) if return_delta else ())


def _launch_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dq: Tensor, dk: Tensor,
                     dv: Tensor, softmax_scale: float, window_size: tuple[int, int], bottom_right: bool,
                     deterministic: bool, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                     max_seqlen_q: Optional[int], max_seqlen_k: Optional[int], config: object, softcap: float,
                     alibi_slopes: Optional[Tensor], dlse: Optional[Tensor], sinks: Optional[Tensor],
                     plain: bool = False) -> tuple[Tensor, Optional[Tensor]]:
    """attention_backward's launches for a call with queries and keys: gradients into dq, dk, dv; returns delta and
    the sinks' gradient parts (None without sinks). ``plain``: a call whose sm90 one pass may keep its replays for
    its launch key's later calls (attention_backward, _ONE_PASS)."""
    if cu_seqlens_q is not None:
        cu_seqlens_q, cu_seqlens_k = launch_safe_offsets(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0])
    inputs = (dout, q, k, v, out)
    dout, q, k, v, out = (_tma_ready(t) for t in inputs)
    plain = plain and all(a is b for a, b in zip(inputs, (dout, q, k, v, out)))  # (no copy: replays take the inputs)
    if cu_seqlens_q is not None:
        _ensure_allocator(q.device)
    if config is None:
        plan = dispatch.backward(q, k, v, dout, window_size, cu_seqlens_q is not None, deterministic, softcap,
                                 alibi_slopes)
    else:
        plan = dispatch.Plan("portable/bwd.py", config)
    if plan.kernel == "hopper/bwd.py":
        packed = None if cu_seqlens_q is None else (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        launch = dispatch.hopper("bwd").launch_bwd_hopper
        found = [] if plain and plan.design == "one pass" else None
        delta, sink_parts = launch(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, window_size, bottom_right,
                                   deterministic, plan.config, dlse=dlse, sinks=sinks, packed=packed, found=found,
                                   softcap=softcap)
        if found and all(r is not None for r in found):
            key = _one_pass_key(dout, q, k, v, out, lse, softmax_scale, window_size, bottom_right, deterministic)
            _ONE_PASS.put(key, (launch, plan.config, found), (configs.BWD_HOPPER, ))
    else:
        seqlen_q = max_seqlen_q if cu_seqlens_q is not None else q.shape[1]
        delta, _, sink_parts = launch_preprocess(out, dout, lse, cu_seqlens_q, seqlen_q, dlse=dlse, sinks=sinks)
        launch_bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   softmax_scale, window_size, bottom_right, deterministic, plan.config, delta, softcap=softcap,
                   alibi_slopes=_unit_last_stride(alibi_slopes))
    if cu_seqlens_q is not None:  # rows past the last sequence
        launch_zero_unused_grads(dq, dk, dv, cu_seqlens_q, cu_seqlens_k)
    return delta, sink_parts


# The sm90 one pass's replays (launcher, config, the three launches' Replays) by the launch key of a plain backward
# call (no packed sequences, softcap, ALiBi, LSE gradient, sinks or given gradient buffers): a training loop's later
# steps launch them without the dispatch, checks and launch keys of the first.
_ONE_PASS = Kept()


def _one_pass_key(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, softmax_scale: float,
                  window_size: tuple[int, int], bottom_right: bool, deterministic: bool) -> tuple:
    """A plain backward call's key in _ONE_PASS: its tensors' launch key, its arguments and the backend dispatch reads
    (its config table is checked by identity)."""
    return launch_key((dout, q, k, v, out, lse), softmax_scale, window_size, bottom_right, deterministic,
                      configs.BWD_BACKEND)


def _one_pass_again(found: tuple, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    softmax_scale: float, window_size: tuple[int, int], bottom_right: bool,
                    return_delta: bool) -> tuple[Tensor, ...]:
    """attention_backward for a plain call whose launch key an earlier call ran on the sm90 one pass (_ONE_PASS)."""
    launch, config, replays = found
    dq, dk, dv = (torch.empty(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v))
    delta, _ = launch(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, window_size, bottom_right, False, config,
                      replays=replays)
    return (dq, dk, dv) + ((delta, ) if return_delta else ())


def _writable_like(g: Optional[Tensor], t: Tensor) -> bool:
    """Whether the kernels can write t's gradient into g as into a new tensor like t: any row strides a descriptor
    takes (slices of a packed tensor too), each row's heads side by side."""
    return (g is not None and g.shape == t.shape and g.dtype == t.dtype and g.device == t.device
            and g.stride(-2) == g.shape[-1] and tma_addressable(g))


def packed_shape(*parts: Tensor) -> Optional[tuple[int, ...]]:
    """The shape (..., len(parts), nheads, headdim) of the contiguous tensor whose consecutive slices ``parts`` are
    (as flash-attn packs qkv and kv), or None where they are not such slices."""
    first = parts[0]
    step, ptr = first.shape[-1] * first.shape[-2] * first.element_size(), first.data_ptr()
    for i in range(1, len(parts)):
        if parts[i].data_ptr() != ptr + i * step:
            return None
    shape = first.shape[:-2] + (len(parts), ) + first.shape[-2:]
    strides = [1]
    for size in reversed(shape[1:]):
        strides.insert(0, strides[0] * size)
    sliced = tuple(strides[:-3] + strides[-2:])  # the packed tensor's strides without the parts' dim
    if first.numel() == 0 or any(p.shape != first.shape or p.stride() != sliced or p.dtype != first.dtype
                                 for p in parts) or any(
            p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() for p in parts[1:]):
        return None
    return shape


def shared_grads(q: Tensor, k: Tensor, v: Tensor) -> tuple[Optional[Tensor], ...]:
    """Buffers for the gradients of q, k, v where q, k, v (or k and v) are slices of one packed tensor (packed_shape):
    slices of one new tensor of its shape, which is then the packed tensor's gradient without a copy
    (api._Unpack); None for the others."""
    if v.data_ptr() - k.data_ptr() != k.shape[-1] * k.shape[-2] * k.element_size():  # neither packing: on every call
        return (None, None, None)
    for parts in ((q, k, v), (k, v)):
        shape = packed_shape(*parts)
        if shape is not None:
            grads = torch.empty(shape, device=q.device, dtype=q.dtype).unbind(-3)
            return (None, ) * (3 - len(parts)) + grads
    return (None, None, None)


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
              cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
              window_left: int, window_right: int, bottom_right: bool, heads_first_out: bool,
              deterministic: bool, softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
              sinks: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward as one op. ``deterministic`` only travels to the backward."""
    out = _new_out(q, heads_first_out)
    return attention_forward(q, k, v, softmax_scale, (window_left, window_right), bottom_right, out, cu_seqlens_q,
                             cu_seqlens_k, max_seqlen_q, max_seqlen_k, softcap=softcap, alibi_slopes=alibi_slopes,
                             sinks=sinks)


fwd = torch.library.custom_op("flashtile::fwd", mutates_args=())(_fwd_impl)


@fwd.register_fake
def _fwd_fake(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
              max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, window_left: int, window_right: int,
              bottom_right: bool, heads_first_out: bool, deterministic: bool, softcap: float = 0.0,
              alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    return _new_out(q, heads_first_out), _new_lse(q, cu_seqlens_q is not None)


def _bwd_impl(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
        max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, window_left: int, window_right: int,
        bottom_right: bool, deterministic: bool, softcap: float = 0.0,
        alibi_slopes: Optional[torch.Tensor] = None, dlse: Optional[torch.Tensor] = None,
        sinks: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv and the sinks' gradient (an empty tensor without sinks: an op returns no None)."""
    grads = _bwd_into((None, None, None), dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                      max_seqlen_k, softmax_scale, window_left, window_right, bottom_right, deterministic, softcap,
                      alibi_slopes, dlse, sinks)
    return grads if sinks is not None else grads + (lse.new_empty(0), )


def _bwd_into(grads_out: tuple, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
              softmax_scale: float, window_left: int, window_right: int, bottom_right: bool, deterministic: bool,
              softcap: float, alibi_slopes: Optional[Tensor], dlse: Optional[Tensor],
              sinks: Optional[Tensor]) -> tuple[Tensor, ...]:
    """attention_backward with the gradients written into ``grads_out`` where it can: (dq, dk, dv) and, with sinks,
    theirs."""
    return attention_backward(dout, q, k, v, out, lse, softmax_scale, (window_left, window_right), bottom_right,
                              deterministic, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softcap=softcap,
                              alibi_slopes=alibi_slopes, dlse=dlse, sinks=sinks, grads_out=grads_out)


def _bwd_eager(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, *args: object) -> tuple[Tensor, ...]:
    """_bwd_impl for eager calls, which unlike an op may return gradients that share memory: where q, k, v (or k and v)
    are slices of one packed tensor, so are their gradients (shared_grads); None for the sinks' gradient without
    sinks."""
    grads = _bwd_into(shared_grads(q, k, v), dout, q, k, v, *args)
    return grads if len(grads) == 4 else grads + (None, )


bwd = torch.library.custom_op("flashtile::bwd", mutates_args=())(_bwd_impl)


@bwd.register_fake
def _bwd_fake(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
              cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
              window_left: int, window_right: int, bottom_right: bool, deterministic: bool, softcap: float = 0.0,
              alibi_slopes: Optional[Tensor] = None, dlse: Optional[Tensor] = None,
              sinks: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (torch.empty(q.shape, device=q.device, dtype=q.dtype), torch.empty(k.shape, device=k.device, dtype=k.dtype),
            torch.empty(v.shape, device=v.device, dtype=v.dtype),
            lse.new_empty(0) if sinks is None else torch.empty_like(sinks))


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, cu_seqlens_q, cu_seqlens_k = inputs[:5]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, inputs[15])  # inputs[15]: the sinks
    ctx.params = inputs[5:11] + inputs[12:15]  # max_seqlen_q … bottom_right, deterministic, softcap, alibi_slopes
    ctx.set_materialize_grads(False)


def _saved_grads(ctx: torch.autograd.function.FunctionCtx, dout: Optional[Tensor], dlse: Optional[Tensor],
                 backward: Callable, sinks_input: int) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """dq, dk, dv and the sinks' gradient (None unless given sinks, input ``sinks_input``, take one) by ``backward``
    (the ``bwd`` op, or its function) from what _setup_context saved; dout is None where only the LSE took a
    gradient."""
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    wanted = sinks if sinks is not None and ctx.needs_input_grad[sinks_input] else None
    dq, dk, dv, dsinks = backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.params, dlse, wanted)
    return dq, dk, dv, dsinks if wanted is not None else None


def sink_grad(sinks: Tensor, lse: Tensor, delta: Tensor) -> Tensor:
    """The sinks' gradient: a sink's share of row i is p_i = exp(sink − lse_i), and d loss / d sink = −Σ_i p_i · delta_i
    over the head's rows (delta = rowsum(dO ∘ O) − dlse, shaped like lse: (batch, nheads, rows) or packed (nheads,
    rows)). Rows of no sequence (lse = −inf) take no part. The kernels' delta launch sums the same in parts; this is
    its form for calls that launch nothing."""
    packed = lse.dim() == 2
    share = torch.exp_(sinks.view((-1, 1) if packed else (1, -1, 1)) - lse).masked_fill_(lse == float("-inf"), 0.0)
    return share.mul_(delta).sum(dim=(1, ) if packed else (0, 2)).neg_()


def _backward(ctx: torch.autograd.function.FunctionCtx, dout: Optional[Tensor], dlse: Optional[Tensor]) -> tuple:
    dq, dk, dv, dsinks = _saved_grads(ctx, dout, dlse, bwd, 15)
    return (dq, dk, dv) + (None, ) * 12 + (dsinks, )


fwd.register_autograd(_backward, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """The same forward and backward as the ``fwd`` op, for eager calls: autograd without the custom op's dispatch
    and checks, which cost more host time than a short step's kernels take (docs/perf/backward.md, "The step around the
    kernels"). It takes the ``fwd`` op's arguments as q, k, v, sinks and a tuple of the rest, which autograd need not
    look through one by one."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor],
                rest: tuple) -> tuple[Tensor, Tensor]:
        args = (q, k, v, *rest, sinks)
        output = _fwd_impl(*args)
        _setup_context(ctx, args, output)
        return output

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, dout: Optional[Tensor], dlse: Optional[Tensor]) -> tuple:
        return *_saved_grads(ctx, dout, dlse, _bwd_eager, 3), None


def pad_head_dim(*tensors: Tensor) -> tuple[Tensor, ...]:
    """The tensors with their last dim zero-padded to a multiple of 8, as flash-attn pads head dims (the same
    scores; O's and the gradients' extra columns come out 0): a tensor descriptor needs 16-byte rows."""
    extra = -tensors[0].shape[-1] % 8
    return tensors if not extra else tuple(F.pad(t, (0, extra)) for t in tensors)


def gather_pages(k_pages: Tensor, v_pages: Tensor, block_table: Tensor, cu_seqlens_k: Tensor,
                 rows: int) -> tuple[Tensor, Tensor]:
    """Packed (rows, nheads_k, headdim) keys and values of the sequences whose keys sit in pages (num_pages,
    page_size, nheads_k, headdim) listed by block_table (batch, max_pages): sequence b's key j is in page
    block_table[b, j // page_size] at slot j % page_size, at row cu_seqlens_k[b] + j. Page ids are clamped into the
    pool. ``rows``: at least cu_seqlens_k[-1], e.g. batch · max_seqlen_k (the rows past the last sequence hold
    copies no kernel reads), so that nothing is read back to the host."""
    page_size = k_pages.shape[1]
    cu = cu_seqlens_k.long()
    position = torch.arange(rows, device=k_pages.device)
    seq = torch.searchsorted(cu[1:], position, right=True).clamp_(max=block_table.shape[0] - 1)  # [total_k]
    j = position - cu[seq]
    column = (j // page_size).clamp_(0, block_table.shape[1] - 1)
    page = block_table[seq, column].long().clamp_(0, k_pages.shape[0] - 1)
    slot = j % page_size
    return k_pages[page, slot], v_pages[page, slot]


def flash_attention(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, window_size: tuple[int, int],
                    bottom_right: bool, deterministic: bool = False, heads_first_out: bool = False,
                    cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None,
                    max_seqlen_q: int = 0, max_seqlen_k: int = 0, softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """The differentiable attention every entry point calls: (out, lse). torch.compile traces the ``fwd`` op; eager
    calls run the same kernels without its dispatch (_Attention where something needs a gradient). A head dim
    that is not a multiple of 8 is padded (pad_head_dim) and O's extra columns sliced off. ``sinks`` (nheads,): a
    learned logit per head that joins each row's denominator (attention_forward); it takes a gradient (sink_grad)."""
    head_dim = q.shape[-1]
    if head_dim % 8:
        q, k, v = pad_head_dim(q, k, v)
        out, lse = flash_attention(q, k, v, softmax_scale, window_size, bottom_right, deterministic, heads_first_out,
                                   cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softcap, alibi_slopes,
                                   sinks)
        return out[..., :head_dim], lse
    if sinks is not None:  # the kernels read float32 (the cast passes the gradient back in the sinks' dtype)
        sinks = sinks.float().contiguous()
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_size[0],
            window_size[1], bottom_right, heads_first_out, deterministic, softcap, alibi_slopes, sinks)
    if torch.compiler.is_compiling():
        return fwd(*args)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                    or (sinks is not None and sinks.requires_grad)):
        return _Attention.apply(q, k, v, sinks, args[3:15])
    return _fwd_impl(*args)


def rotary(x: Tensor, cos: Tensor, sin: Tensor, cache_seqlens: Tensor, per_token: bool, interleaved: bool) -> Tensor:
    """x (batch, seqlen, nheads, headdim) turned by the rotary table at each token's position
    (kernels/portable/new_tokens.py)."""
    x, cos, sin = (_unit_last_stride(t) for t in (x, cos, sin))
    return launch_rotary(x, cos, sin, cache_seqlens, per_token, interleaved)


def append_to_cache(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, cache_seqlens: Tensor,
                    batch_idx: Optional[Tensor], block_table: Optional[Tensor], cos: Optional[Tensor] = None,
                    sin: Optional[Tensor] = None, interleaved: bool = True) -> None:
    """Write the new tokens k, v (batch, seqlen_new, nheads_k, headdim) at cache_seqlens[b] onwards, in place, in
    one launch (kernels/portable/new_tokens.py); k turned by the rotary table cos, sin first when given."""
    k, v, cos, sin = (_unit_last_stride(t) for t in (k, v, cos, sin))
    launch_append(k, v, k_cache, v_cache, cache_seqlens, block_table, batch_idx, cos, sin, interleaved)


def kvcache_forward(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor, batch_idx: Optional[Tensor],
                    block_table: Optional[Tensor], capacity: int, softmax_scale: float, window_size: tuple[int, int],
                    num_splits: int, config: object = None, leftpad: Optional[Tensor] = None, softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, want_lse: bool = True,
                    seqlen_new: int = 0) -> tuple[Tensor, Optional[Tensor]]:
    """Split-KV attention of q (batch, seqlen_q, nheads, headdim) over the first cache_seqlens[b] + seqlen_new
    keys of each sequence's cache (from leftpad[b] on, if given; scores capped by softcap > 0, ALiBi biases with
    alibi_slopes), in one launch. Returns (out, lse [batch, nheads, seqlen_q], or None without want_lse)."""
    batch, seqlen_q, nheads, head_dim = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(batch, nheads, seqlen_q, device=q.device, dtype=torch.float32) if want_lse else None
    plan = dispatch.decode(q, k_cache, v_cache, capacity, num_splits, batch_idx, block_table, leftpad, softcap,
                           alibi_slopes, window_size, config)
    if plan.kernel == "hopper/decode.py":
        dispatch.hopper("decode").launch_decode_hopper(q, k_cache, v_cache, cache_seqlens, out, lse, softmax_scale,
                                                       plan.config, seqlen_new)
        return out, lse
    scratch = None
    if plan.splits > 1:
        scratch = _scratch(q.device, arrival_slots(batch, k_cache.shape[2], nheads, seqlen_q, plan.config),
                           partial_elements(plan.splits, batch, seqlen_q, nheads, head_dim))
    launch_decode(q, k_cache, v_cache, cache_seqlens, block_table, batch_idx, out, lse, plan.splits, plan.chunk,
                  softmax_scale, window_size, plan.config, scratch, leftpad, softcap, _unit_last_stride(alibi_slopes),
                  seqlen_new)
    return out, lse


_SCRATCH = {}
_RETIRED = []  # outgrown scratch buffers: a captured CUDA graph may still point at them


def _scratch(device: torch.device, arrivals: int, partials: int) -> tuple[Tensor, Tensor]:
    """(int32 arrival counters, zeroed and left zeroed by the decode kernel; float32 room for ``partials``
    partial results), one pair per device and stream, grown on demand: calls on one stream run in order, so
    two never use them at the same time. While a CUDA graph is captured the partials come from its own pool."""
    key = (device, stream_handle(device) if device.type == "cuda" else 0)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    counters, part = _SCRATCH.get(key, (None, None))
    if counters is None or counters.numel() < arrivals or (part.numel() < partials and not capturing):
        _RETIRED.extend(t for t in (counters, part) if t is not None)
        counters = torch.zeros(1 << max(12, (arrivals - 1).bit_length()), dtype=torch.int32, device=device)
        part = torch.empty(1 << max(20, (partials - 1).bit_length()), dtype=torch.float32, device=device)
        _SCRATCH[key] = counters, part
    if capturing:  # the graph's own partials: the shared ones need not grow for it
        part = torch.empty(partials, dtype=torch.float32, device=device)
    elif torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory:
        part.fill_(float("nan"))  # as torch.empty does in this mode, so that an unwritten partial shows
    return counters, part


def combine(out_partials: Tensor, lse_partials: Tensor,
            dtype: Optional[torch.dtype] = None) -> tuple[Tensor, Tensor]:
    """Merge partial attention results by their LSE: (out [batch, seqlen, nheads, headdim], lse)."""
    _, batch, seqlen, nheads, head_dim = out_partials.shape
    out = torch.empty(batch, seqlen, nheads, head_dim, device=out_partials.device, dtype=dtype or out_partials.dtype)
    lse = torch.empty(batch, nheads, seqlen, device=out_partials.device, dtype=torch.float32)
    if out.numel():
        launch_combine(out_partials, lse_partials, out, lse)
    return out, lse
