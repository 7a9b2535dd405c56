"""ops.py's gradient buffers: which tensors are slices of one packed tensor (packed_shape), the kernels writing
gradients into such slices in place (attention_backward's grads_out), and the eager backward giving packed inputs
gradients that share one buffer (shared_grads)."""
import pytest
import torch
from helpers import DEVICE, poisoned_outputs, randn

import flashtile
from flashtile import ops


def test_packed_shape_of_consecutive_slices():
    qkv = randn(2, 9, 3, 4, 16, dtype=torch.float16)
    assert ops.packed_shape(*qkv.unbind(2)) == (2, 9, 3, 4, 16)
    assert ops.packed_shape(*qkv[:, :, 1:].unbind(2)) is None  # rows of three, two taken
    kv = randn(7, 2, 2, 16, dtype=torch.float16)  # varlen (total, 2, nheads_k, headdim)
    assert ops.packed_shape(*kv.unbind(1)) == (7, 2, 2, 16)


@pytest.mark.parametrize("case", ["separate", "reordered", "heads-outermost", "empty"])
def test_packed_shape_refuses_other_tensors(case):
    qkv = randn(2, 9, 3, 4, 16, dtype=torch.float16)
    parts = {"separate": [randn(2, 9, 4, 16, dtype=torch.float16) for _ in range(3)],
             "reordered": [qkv[:, :, 1], qkv[:, :, 0], qkv[:, :, 2]],
             "heads-outermost": randn(2, 9, 4, 3, 16, dtype=torch.float16).transpose(2, 3).unbind(2),
             "empty": torch.empty(2, 0, 3, 4, 16, dtype=torch.float16, device=DEVICE).unbind(2)}[case]
    assert ops.packed_shape(*parts) is None


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_gradients_written_into_packed_slices(varlen):
    """grads_out slices of one (..., 3, nheads, headdim) tensor are written in place (the same tensors come back), with
    the gradients of a call that allocates its own; GQA through kv slices (dq separate)."""
    shape = (25, ) if varlen else (2, 13)
    q = randn(*shape, 4, 32, dtype=torch.float16)
    kv = randn(*shape, 2, 2, 32, dtype=torch.float16)
    k, v = kv.unbind(-3)
    dout = randn(*shape, 4, 32, dtype=torch.float16)
    extra = {}
    if varlen:
        cu = torch.tensor([0, 9, 25], dtype=torch.int32, device=DEVICE)
        extra = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=16, max_seqlen_k=16)
    out, lse = ops.attention_forward(q, k, v, 32 ** -0.5, (-1, 0), True, **extra)
    want = ops.attention_backward(dout, q, k, v, out, lse, 32 ** -0.5, (-1, 0), True, False, **extra)
    with poisoned_outputs():
        dq, dkv = torch.empty_like(q), torch.empty_like(kv)
    into = (dq, *dkv.unbind(-3))
    got = ops.attention_backward(dout, q, k, v, out, lse, 32 ** -0.5, (-1, 0), True, False, grads_out=into, **extra)
    assert all(g is t for g, t in zip(got, into))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_eager_backward_shares_one_buffer_among_packed_inputs():
    """q, k, v sliced out of one qkv that takes a gradient: their gradients are slices of one new tensor laid out as
    qkv (what api's unpacking hands on without a copy), and equal those of separate q, k, v."""
    qkv = randn(2, 17, 3, 2, 16, dtype=torch.float16).requires_grad_()
    dout = randn(2, 17, 2, 16, dtype=torch.float16)
    parts = qkv.unbind(2)
    grads = torch.autograd.grad(flashtile.flash_attn_func(*parts, causal=True), parts, dout)
    assert ops.packed_shape(*grads) == qkv.shape and all(g._base is grads[0]._base for g in grads)
    leaves = [t.detach().clone().requires_grad_() for t in parts]
    want = torch.autograd.grad(flashtile.flash_attn_func(*leaves, causal=True), leaves, dout)
    assert ops.packed_shape(*want) is None
    for g, w in zip(grads, want):
        assert torch.equal(g, w)
