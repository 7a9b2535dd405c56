"""The packed entry points of flash-attn's API (api.py): each equals flash_attn_func / flash_attn_varlen_func on the
unpacked tensors, output and gradients, and names the argument whose shape is wrong."""
import pytest
import torch
from helpers import DEVICE, randn

import flashtile
from flashtile import api


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


@pytest.mark.parametrize("max_seqlen_k", [16, 21], ids=["max-exact", "max-above"])
@pytest.mark.parametrize("page_size", [4, 16])
def test_varlen_with_block_table_equals_packed_keys(page_size, max_seqlen_k):
    """flash_attn_varlen_func(..., block_table=): keys and values in pages, shuffled in the pool, give the same
    output as the same keys packed, whether max_seqlen_k is the longest sequence or above it (the gathered keys
    then run past the last sequence's)."""
    cu_q = torch.tensor([0, 3, 10], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 13, 29], dtype=torch.int32, device=DEVICE)
    q = randn(10, 4, 32, dtype=torch.float16)
    k, v = (randn(29, 2, 32, dtype=torch.float16) for _ in range(2))
    pages_per_seq = -(-16 // page_size)
    table = torch.randperm(2 * pages_per_seq, device=DEVICE).int().reshape(2, pages_per_seq)
    k_pages, v_pages = (torch.zeros(2 * pages_per_seq, page_size, 2, 32, dtype=torch.float16, device=DEVICE)
                        for _ in range(2))
    for b in range(2):
        for j in range(int(cu_k[b + 1] - cu_k[b])):
            page, slot = int(table[b, j // page_size]), j % page_size
            k_pages[page, slot], v_pages[page, slot] = k[cu_k[b] + j], v[cu_k[b] + j]
    want = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 16, causal=True)
    got = flashtile.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 7, max_seqlen_k, causal=True,
                                           block_table=table)
    assert torch.equal(got, want)
    with pytest.raises(TypeError, match="block_table must be int32"):
        flashtile.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 7, 16, block_table=table.long())


def test_learnable_sink_joins_the_denominator():
    """learnable_sink: out and LSE as if each row's softmax had one more logit (the head's sink) and no value, against
    the float64 reference with that logit appended; the sinks take a gradient."""
    q, k, v = (randn(2, 19, 4, 32, dtype=torch.float32) for _ in range(3))
    sink = torch.randn(4, device=DEVICE, requires_grad=True)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True, learnable_sink=sink)
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) / 32 ** 0.5
    s = s.masked_fill(torch.ones(19, 19, dtype=torch.bool, device=DEVICE).triu(1), float("-inf"))
    s = torch.cat([s, sink.double()[None, :, None, None].expand(2, 4, 19, 1)], -1)
    p = torch.softmax(s, -1)[..., :-1]
    torch.testing.assert_close(out.double(), torch.einsum("bhij,bjhd->bihd", p, v.double()), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert sink.grad is not None and sink.grad.abs().max() > 0
    with pytest.raises(ValueError, match="learnable_sink must have shape"):
        flashtile.flash_attn_func(q, k, v, learnable_sink=torch.zeros(3, device=DEVICE))


def test_bert_padding_helpers_under_our_names():
    hidden = torch.randn(2, 3, 5, device=DEVICE)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], device=DEVICE)
    rows, indices, cu, longest, _ = flashtile.unpad_input(hidden, mask)
    assert cu.tolist() == [0, 2, 5] and longest == 3
    assert torch.equal(flashtile.pad_input(rows, indices, 2, 3)[mask.bool()], hidden[mask.bool()])


@pytest.mark.parametrize("call", ["qkvpacked", "kvpacked", "varlen_qkvpacked"])
def test_packed_gradient_is_not_stacked(call):
    """The packed tensor's gradient is the buffer the kernels wrote dq, dk, dv into (ops.shared_grads): no stack of
    separate gradients in the backward (the profiler's ops)."""
    cu = torch.tensor([0, 7, 20], dtype=torch.int32, device=DEVICE)
    q = randn(2, 10, 2, 16, dtype=torch.float16)
    packed = randn(20, 3, 2, 16, dtype=torch.float16) if call.startswith("varlen") else randn(
        2, 10, 3 if call == "qkvpacked" else 2, 2, 16, dtype=torch.float16)
    packed.requires_grad_()
    fn = {"qkvpacked": lambda: flashtile.flash_attn_qkvpacked_func(packed, causal=True),
          "kvpacked": lambda: flashtile.flash_attn_kvpacked_func(q, packed, causal=True),
          "varlen_qkvpacked": lambda: flashtile.flash_attn_varlen_qkvpacked_func(packed, cu, 13, causal=True)}[call]
    with torch.autograd.profiler.profile() as prof:
        out = fn()
        out.backward(torch.randn_like(out))
    assert "aten::stack" not in {event.name for event in prof.function_events}
    assert packed.grad.shape == packed.shape and packed.grad.isfinite().all()


def test_packed_gradient_of_other_layouts_and_of_some_parts():
    """A qkv whose parts are not laid out as flash-attn packs them (heads outermost) still gets its gradient (stacked);
    so does one of whose parts only some take a gradient."""
    qkv = randn(2, 9, 2, 3, 16, dtype=torch.float16).transpose(2, 3)
    dout = randn(2, 9, 2, 16, dtype=torch.float16)
    want = _grads(lambda q, k, v: flashtile.flash_attn_func(q, k, v), qkv.unbind(2), dout)
    got = _grads(lambda qkv: flashtile.flash_attn_qkvpacked_func(qkv), (qkv, ), dout)
    assert torch.equal(got[1], torch.stack(want[1:], 2))
    leaf = qkv.detach().clone().requires_grad_()
    q, k, v = api._unpack("qkv", leaf, 3, "(batch, seqlen, 3, nheads, headdim)")
    (k.float() * 2).sum().backward()
    assert torch.equal(leaf.grad[:, :, 1], torch.full_like(k, 2)) and not leaf.grad[:, :, 0::2].any()


def test_packed_call_under_torch_compile():
    """flash_attn_qkvpacked_func traced whole by torch.compile (its unpacking is a plain unbind there, the custom ops
    run): the same output and gradients as the eager call, whose dqkv comes without a stack."""
    proj = torch.nn.Linear(32, 3 * 32, device=DEVICE, dtype=torch.float16)
    x = randn(2, 24, 32, dtype=torch.float16)

    def block(x):
        return flashtile.flash_attn_qkvpacked_func(proj(x).view(2, 24, 3, 2, 16), causal=True).sum()

    eager = torch.autograd.grad(block(x), proj.weight)[0]
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    assert torch.equal(torch.autograd.grad(compiled(x), proj.weight)[0], eager)
