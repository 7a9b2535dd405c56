"""The packed entry points of flash-attn's API (api.py): each equals flash_attn_func / flash_attn_varlen_func on the
unpacked tensors, output and gradients, and names the argument whose shape is wrong."""
import pytest
import torch

import flashtile
from helpers import DEVICE, randn


def _grads(fn, leaves, dout):
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    out = fn(*leaves)
    return [out.detach(), *torch.autograd.grad(out, leaves, dout)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_qkvpacked_and_kvpacked_equal_the_unpacked_call(causal):
    qkv = randn(2, 33, 3, 4, 32, dtype=torch.float16)
    q, k, v = qkv.unbind(2)
    dout = randn(2, 33, 4, 32, dtype=torch.float16)
    want = _grads(lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
    got = _grads(lambda qkv: flashtile.flash_attn_qkvpacked_func(qkv, causal=causal), (qkv, ), dout)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], torch.stack(want[1:], 2))
    kv = randn(2, 41, 2, 2, 32, dtype=torch.float16)  # GQA: 4 query heads over 2 KV heads, Nq != Nk
    want = _grads(lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=causal), (q, *kv.unbind(2)), dout)
    got = _grads(lambda q, kv: flashtile.flash_attn_kvpacked_func(q, kv, causal=causal), (q, kv), dout)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got[2], torch.stack(want[2:], 2))


def test_varlen_packed_equal_the_unpacked_call():
    cu = torch.tensor([0, 5, 30], dtype=torch.int32, device=DEVICE)
    qkv = randn(30, 3, 4, 32, dtype=torch.float16)
    q, k, v = qkv.unbind(1)
    dout = randn(30, 4, 32, dtype=torch.float16)
    want = _grads(lambda q, k, v: flashtile.flash_attn_varlen_func(q, k, v, cu, cu, 25, 25, causal=True), (q, k, v),
                  dout)
    got = _grads(lambda qkv: flashtile.flash_attn_varlen_qkvpacked_func(qkv, cu, 25, causal=True), (qkv, ), dout)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], torch.stack(want[1:], 1))
    got = _grads(lambda q, kv: flashtile.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 25, 25, causal=True),
                 (q, torch.stack((k, v), 1)), dout)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], torch.stack(want[2:], 1))


def test_packed_shapes_are_checked_by_name():
    q = randn(1, 8, 2, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"qkv must be \(batch, seqlen, 3, nheads, headdim\)"):
        flashtile.flash_attn_qkvpacked_func(randn(1, 8, 2, 2, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match="kv must be"):
        flashtile.flash_attn_kvpacked_func(q, q)
    with pytest.raises(TypeError, match="qkv must be a torch.Tensor"):
        flashtile.flash_attn_varlen_qkvpacked_func([q], None, 8)
