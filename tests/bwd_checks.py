"""The backward's checks that the portable and the sm90 backward tests share (tests/kernels/*/test_bwd.py): gradients
against float64 autograd through the reference within 2x of PyTorch's own error, gradients into given tensors, the
LSE's gradient, a CUDA graph's replay."""
import torch
from helpers import DEVICE, assert_attention_close, poisoned_outputs, randn, slack, torch_attention

import flashtile
from flashtile import ops, reference


def gradients(fn, inputs, dout):
    """(out, dq, dk, dv) of fn on fresh leaves."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(dout)
    return (out, *(t.grad for t in leaves))


def assert_grads_close(ours, ref, baseline):
    """Each of out, dq, dk, dv: max error within 2x PyTorch's own low-precision error plus a small atol
    scaled to the tensor's size (at least one ulp of the dtype there)."""
    for name, a, r, base in zip(("out", "dq", "dk", "dv"), ours, ref, baseline):
        assert a.shape == r.shape, name
        assert not a.isnan().any(), f"NaN in {name}"
        err = (a.double() - r).abs().max().item()
        base_err = (base.double() - r).abs().max().item()
        bound = 2 * base_err + slack(r, a.dtype, scaled=True)
        assert err <= bound, f"{name}: max error {err:.3g} > 2 x PyTorch's {base_err:.3g} + atol"


def check(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal=False, window_size=(-1, -1),
          deterministic=False, scale=1.0, inputs=None):
    """``inputs(q, k)`` reshapes the normal draws of q and k (a distribution of scores to test)."""
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype, scale=scale)
    k = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    if inputs is not None:
        q, k = inputs(q, k)
    v = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    dout = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    with poisoned_outputs():
        ours = gradients(lambda q, k, v: flashtile.flash_attn_func(
            q, k, v, causal=causal, window_size=window_size, deterministic=deterministic), (q, k, v), dout)
    ref = gradients(lambda q, k, v: reference.attention(q, k, v, causal=causal, window_size=window_size)[0],
                    (q, k, v), dout.double())
    base = gradients(lambda q, k, v: torch_attention(q, k, v, causal, window_size), (q, k, v), dout)
    assert_grads_close(ours, ref, base)
    return ours


def assert_lse_gradients_close(q, k, v, dout, dlse, causal, deterministic):
    """dQ, dK, dV of sum(out ∘ dout) + sum(lse · dlse) (no out term when dout is None) within 2x of PyTorch's own
    error (the reference in the inputs' dtype) against float64 autograd through the reference."""
    def loss_of(fn):
        def loss(q, k, v):
            out, lse = fn(q, k, v)
            lse = torch.where(torch.isinf(lse), 0, lse)  # rows with no key: their LSE is -inf, its gradient 0
            total = (lse.float() * dlse).sum()
            return total if dout is None else total + (out.float() * dout.float()).sum()
        return loss

    def ours(q, k, v):
        return flashtile.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic,
                                         return_attn_probs=True)[:2]
    got = grads_of_loss(loss_of(ours), (q, k, v))
    ref = grads_of_loss(loss_of(lambda q, k, v: reference.attention(q, k, v, causal=causal)), (q, k, v), True)
    base = grads_of_loss(loss_of(lambda q, k, v: reference.attention(q, k, v, causal=causal, upcast=False)),
                          (q, k, v))
    for name, g, r, b in zip("qkv", got, ref, base):
        err, base_err = (g.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        assert err <= 2 * base_err + 1e-2, (name, err, base_err)


def grads_of_loss(loss_fn, inputs, upcast=False):
    """The gradients of ``loss_fn`` at fresh leaves of ``inputs`` (float64 with ``upcast``), zeros where unused."""
    leaves = [(t.double() if upcast else t).detach().clone().requires_grad_() for t in inputs]
    grads = torch.autograd.grad(loss_fn(*leaves), leaves, allow_unused=True)  # the LSE alone does not use V
    return [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


def check_gradients_into_given_tensors(q, k, v, dout, deterministic, dlse, strided_v, dq_exact):
    """ops.attention_backward(grads_out=, return_delta=True), causal: contiguous tensors are written and returned as
    the gradients (a strided one, with ``strided_v`` for dV, is replaced by a new tensor); the gradients equal a plain
    call's (dQ within float32 reordering unless ``dq_exact``); the delta returned is rowsum(dO ∘ O) − dLSE."""
    scale = q.shape[-1] ** -0.5
    out, lse = ops.attention_forward(q, k, v, scale, (-1, 0), True)
    dlse = torch.randn_like(lse) if dlse else None
    args = (dout, q, k, v, out, lse, scale, (-1, 0), True, deterministic)
    want = ops.attention_backward(*args, dlse=dlse)
    given = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    if strided_v:
        given[2] = torch.full(v.transpose(1, 2).shape, float("nan"), dtype=v.dtype, device=DEVICE).transpose(1, 2)
    *got, delta = ops.attention_backward(*args, dlse=dlse, grads_out=tuple(given), return_delta=True)
    assert got[0] is given[0] and got[1] is given[1] and (got[2] is given[2]) != strided_v
    if dq_exact:
        assert torch.equal(got[0], want[0])
    else:
        torch.testing.assert_close(got[0], want[0], atol=2e-2, rtol=1e-2)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    rowsum = (dout.float() * out.float()).sum(-1).transpose(1, 2)
    torch.testing.assert_close(delta, rowsum - (0 if dlse is None else dlse), atol=1e-2, rtol=1e-3)


def assert_graph_replays_like_eager(step, inputs):
    """Capture step() in a CUDA graph, refill the inputs with fresh random values and replay: every output
    must equal an eager step's bitwise."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        for t in inputs:
            t.copy_(randn(*t.shape, dtype=t.dtype))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, step()):
        assert torch.equal(got, want)


def check_sinks(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal=False, scale=1.0,
                sink_scale=2.0, dlse=False, deterministic=False, backward=True, window_size=(-1, -1)):
    """learnable_sink (float32, one logit per query head): O and LSE against the float64 reference with each head's
    sink in every row's softmax (poisoned outputs), within 2x of PyTorch's own error (the reference in the inputs'
    dtype, as an eager model computes sinks); then, with ``backward``, dq, dk, dv and the sinks' gradient of
    sum(out ∘ dout) (+ sum(lse · dlse) with ``dlse``) likewise. ``scale`` multiplies q (large logits),
    ``sink_scale`` the sinks' normal draws (a sink far above the scores takes the rows over); ``window_size``: a sliding
    window (gpt-oss's layers: 128 keys and sinks)."""
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype, scale=scale)
    k, v = (randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype) for _ in range(2))
    sinks = randn(nheads, dtype=torch.float32, scale=sink_scale)
    with poisoned_outputs():
        out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=causal, window_size=window_size,
                                                deterministic=deterministic, return_attn_probs=True,
                                                learnable_sink=sinks)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, window_size=window_size, sinks=sinks)
    base, _ = reference.attention(q, k, v, causal=causal, window_size=window_size, sinks=sinks, upcast=False)
    assert_attention_close(out, ref, base, lse, ref_lse)
    if not backward:
        return
    dout = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    lse_weight = randn(batch, nheads, seqlen_q, dtype=torch.float32) if dlse else None

    def loss_of(fn):
        def loss(q, k, v, sinks):
            out, lse = fn(q, k, v, sinks)
            total = (out.float() * dout.float()).sum()
            return total if lse_weight is None else total + (lse.float() * lse_weight).sum()
        return loss

    def ours(q, k, v, sinks):
        return flashtile.flash_attn_func(q, k, v, causal=causal, window_size=window_size, deterministic=deterministic,
                                         return_attn_probs=True, learnable_sink=sinks)[:2]
    inputs = (q, k, v, sinks)
    got = grads_of_loss(loss_of(ours), inputs)
    want = grads_of_loss(loss_of(lambda q, k, v, s: reference.attention(q, k, v, causal=causal, window_size=window_size,
                                                                        sinks=s)), inputs, True)
    base = grads_of_loss(loss_of(lambda q, k, v, s: reference.attention(q, k, v, causal=causal, window_size=window_size,
                                                                        sinks=s, upcast=False)), inputs)
    # A FlashAttention backward reads O as stored, in the inputs' dtype: the sinks' gradient from the exact O rounded to
    # it is an error no kernel avoids, and so is the one carried from the forward's own O and LSE (held above to 2x
    # PyTorch's error). PyTorch's takes rowsum(P ∘ dP) instead and is at times the luckiest of the three.
    def sink_grad(o, o_lse):
        share = torch.exp(sinks.double()[None, :, None] - o_lse.double())  # [batch, nheads, seqlen_q]
        delta = (o.double() * dout.double()).sum(-1).transpose(1, 2)
        return -(share * (delta if lse_weight is None else delta - lse_weight.double())).sum((0, 2))
    base[3] = max((base[3].double(), sink_grad(ref.to(dtype), ref_lse), sink_grad(out, lse)),
                  key=lambda g: (g - want[3]).abs().max().item())
    assert_close_as_pytorch(("dq", "dk", "dv", "dsinks"), got, want, base, inputs)


def assert_close_as_pytorch(names, got, want, base, inputs):
    """Each gradient in ``got`` has its input's dtype, no NaN, and an error against the float64 ``want`` within 2x of
    PyTorch's own (``base``) plus a small atol."""
    for name, g, r, b, x in zip(names, got, want, base, inputs):
        assert g.dtype == x.dtype and not g.isnan().any(), name
        err, base_err = (g.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        bound = 2 * base_err + slack(r, x.dtype, scaled=True)
        assert err <= bound, f"{name}: max error {err:.3g} > 2 x PyTorch's {base_err:.3g} + atol"
