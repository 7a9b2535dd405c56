"""flashtile.integrations.flash_attn: `import flash_attn` gives flashtile's functions while installed, and the
modules that were there before (or none) afterwards; the private forward/backward that ring-attention libraries
call, and bert_padding's helpers, with flash-attn's signatures and results."""
import importlib
import sys

import pytest
import torch
from helpers import DEVICE, randn

import flashtile
import flashtile.integrations.flash_attn as shim


def test_install_then_uninstall_restores_what_was_there():
    before = {name: sys.modules.get(name) for name in ("flash_attn", "flash_attn.bert_padding")}
    with shim.installed():
        import flash_attn
        from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: F401
        from flash_attn.flash_attn_interface import _flash_attn_backward, _flash_attn_forward  # noqa: F401
        assert flash_attn_func is flashtile.flash_attn_func and flash_attn.__version__.startswith("2.")
        shim.install()  # twice: still one set of modules to undo
    assert {name: sys.modules.get(name) for name in before} == before
    if before["flash_attn"] is None:
        with pytest.raises(ImportError):
            importlib.import_module("flash_attn")


@pytest.mark.parametrize("buffers", ["contiguous", "packed", "strided"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_private_forward_and_backward_equal_flash_attn_func(causal, buffers):
    """_flash_attn_forward / _flash_attn_backward as ring-flash-attention calls them: out and LSE, then dq, dk, dv
    written into the given buffers (contiguous ones and slices of one packed dkv by the kernels, other strided ones
    copied into), equal to flash_attn_func's forward and autograd (GQA, Nq != Nk); softmax_d, the delta the kernels
    used."""
    q = randn(2, 21, 4, 32, dtype=torch.float16)
    k, v = (randn(2, 30, 2, 32, dtype=torch.float16) for _ in range(2))
    dout = randn(2, 21, 4, 32, dtype=torch.float16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want, want_lse, _ = flashtile.flash_attn_func(*leaves, causal=causal, return_attn_probs=True)
    want_grads = torch.autograd.grad(want, leaves, dout)
    with shim.installed():
        from flash_attn.flash_attn_interface import _flash_attn_backward, _flash_attn_forward
        out, lse, _, _ = _flash_attn_forward(q, k, v, 0.0, 32 ** -0.5, causal, -1, -1, 0.0, None, False)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        if buffers == "strided":  # the same shapes, heads outermost in memory
            grads = [g.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3) for g in grads]
        if buffers == "packed":  # as flash-attn's kvpacked backward passes them
            grads = [grads[0], *torch.stack(grads[1:], 2).unbind(2)]
        delta = _flash_attn_backward(dout, q, k, v, out, lse, *grads, 0.0, 32 ** -0.5, causal, -1, -1, 0.0, None,
                                     False)
        with pytest.raises(NotImplementedError, match="dropout_p"):
            _flash_attn_forward(q, k, v, 0.1, 1.0, causal, -1, -1, 0.0, None, False)
    assert torch.equal(out, want.detach()) and torch.equal(lse, want_lse)
    for got, expected in zip(grads, want_grads):
        assert torch.equal(got, expected)
    torch.testing.assert_close(delta, (dout.float() * out.float()).sum(-1).transpose(1, 2))


def test_bert_padding_unpad_and_pad():
    hidden = torch.randn(2, 4, 3, device=DEVICE)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], device=DEVICE)
    with shim.installed():
        from flash_attn.bert_padding import pad_input, unpad_input
        rows, indices, cu_seqlens, longest, used = unpad_input(hidden, mask)
        back = pad_input(rows, indices, 2, 4)
    assert rows.shape == (4, 3) and indices.tolist() == [0, 1, 2, 4] and cu_seqlens.tolist() == [0, 3, 4]
    assert longest == 3 and used.tolist() == [3, 1] and cu_seqlens.dtype == torch.int32
    assert torch.equal(back[mask.bool()], hidden[mask.bool()]) and not back[~mask.bool()].any()


def test_softmax_d_of_no_rows():
    """_flash_attn_backward of a call with no query rows: zero gradients, softmax_d an empty float32 tensor like the
    LSE."""
    q = torch.empty(2, 0, 4, 32, dtype=torch.float16, device=DEVICE)
    k = randn(2, 5, 4, 32, dtype=torch.float16)
    lse = torch.empty(2, 4, 0, device=DEVICE)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, k)]
    with shim.installed():
        from flash_attn.flash_attn_interface import _flash_attn_backward
        delta = _flash_attn_backward(q, q, k, k, q, lse, *grads, 0.0, None, False, -1, -1, 0.0, None, False)
    assert delta.shape == lse.shape and delta.dtype == torch.float32
    assert not grads[1].any() and not grads[2].any()


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("offsets", ["int", "tensor"])
def test_apply_rotary_emb(offsets, interleaved):
    """flash_attn.layers.rotary.apply_rotary_emb, as flash-attn's own tests import it: token t of sequence b turned at
    position offset + t (an int, or each sequence's own), against the float64 reference within 2x the fp16 rounding
    of that reference; inplace writes into x; packed sequences and gradients raise, as does the dropout-mask helper
    (flashtile returns no mask)."""
    from flashtile import reference
    x = randn(3, 5, 4, 64, dtype=torch.float16)
    angle = torch.rand(40, 16, device=DEVICE) * 6.3
    cos, sin = torch.cos(angle).half(), torch.sin(angle).half()
    start = 7 if offsets == "int" else torch.tensor([0, 9, 30], dtype=torch.int32, device=DEVICE)
    with shim.installed():
        from flash_attn.flash_attn_interface import _get_block_size_n
        from flash_attn.layers.rotary import apply_rotary_emb
        out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=start)
        positions = (torch.as_tensor(start, device=DEVICE).reshape(-1, 1) + torch.arange(5, device=DEVICE)).expand(3, 5)
        ref = reference.rotary(x, cos, sin, positions, interleaved)
        rounding = (ref.half().double() - ref).abs().max().item()
        assert (out.double() - ref).abs().max().item() <= 2 * rounding + 1e-6
        y = x.clone()
        assert apply_rotary_emb(y, cos, sin, interleaved=interleaved, inplace=True, seqlen_offsets=start) is y
        assert torch.equal(y, out)
        with pytest.raises(NotImplementedError, match="packed"):
            apply_rotary_emb(x.flatten(0, 1), cos, sin, cu_seqlens=torch.tensor([0, 15], dtype=torch.int32))
        with pytest.raises(NotImplementedError, match="no backward"):
            apply_rotary_emb(x.float().requires_grad_(), cos, sin)
        with pytest.raises(NotImplementedError, match="dropout"):
            _get_block_size_n(x.device, 64, True, False)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_private_varlen_forward_and_backward_equal_flash_attn_varlen_func(causal):
    """_flash_attn_varlen_forward / _flash_attn_varlen_backward as ring-flash-attention's varlen functions call them
    (flash-attn 2.6-2.8's signatures): out and the (nheads, total_q) LSE, then dq, dk, dv written into the given
    buffers, equal to flash_attn_varlen_func's forward and autograd (GQA, a sequence without keys, rows past the last
    sequence, zero_tensors); options flashtile lacks raise NotImplementedError naming them."""
    from helpers import varlen_inputs
    q, k, v, cu_q, cu_k = varlen_inputs([17, 9, 30], [25, 0, 30], 4, 2, 32, torch.float16)
    q = torch.cat([q, randn(3, 4, 32, dtype=torch.float16)])  # rows of no sequence
    dout = randn(*q.shape, dtype=torch.float16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want, want_lse, _ = flashtile.flash_attn_varlen_func(*leaves, cu_q, cu_k, 30, 30, causal=causal,
                                                         return_attn_probs=True)
    want_grads = torch.autograd.grad(want, leaves, dout)
    with shim.installed():
        from flash_attn.flash_attn_interface import _flash_attn_varlen_backward, _flash_attn_varlen_forward
        out, lse, _, _ = _flash_attn_varlen_forward(q, k, v, cu_q, cu_k, 30, 30, 0.0, 32 ** -0.5, causal,
                                                    zero_tensors=True)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        delta = _flash_attn_varlen_backward(dout, q, k, v, out, lse, *grads, cu_q, cu_k, 30, 30, 0.0, 32 ** -0.5,
                                            causal, -1, -1, 0.0, None, False)
        for option in ("leftpad_k", "seqused_k"):
            with pytest.raises(NotImplementedError, match=option):
                _flash_attn_varlen_forward(q, k, v, cu_q, cu_k, 30, 30, 0.0, None, causal,
                                           **{option: cu_k[1:] - cu_k[:-1]})
    assert torch.equal(out[:56], want.detach()[:56]) and not out[56:].any()
    assert torch.equal(lse[:, :56], want_lse[:, :56])
    for got, expected in zip(grads, want_grads):
        assert torch.equal(got, expected)
    torch.testing.assert_close(delta[:, :56], (dout.float() * out.float()).sum(-1).t()[:, :56])
