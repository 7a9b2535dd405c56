"""flashtile.sdpa: aten's flash attention ops on flashtile's kernels. On the CPU tier the kernels are registered
for the CPU key (the ops have no CPU kernel of their own) and called as PyTorch's SDPA and varlen code call them;
on the GPU, F.scaled_dot_product_attention itself, with the profiler naming the kernels that ran."""
import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE, randn

import flashtile
import flashtile.sdpa
from flashtile import reference


@pytest.fixture
def cpu_kernels():
    if DEVICE != "cpu":
        pytest.skip("the CPU registration stands in for the CUDA one where there is no GPU")
    handle = flashtile.sdpa.register_kernels("CPU")
    yield
    handle.remove()


def _check(got, want, base):
    for g, w, b in zip(got, want, base):
        assert (g.double() - w).abs().max() <= 2 * (b.double() - w).abs().max() + 1e-3


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [32, 40], ids=lambda d: f"d{d}")
def test_sdpa_flash_op_forward_and_backward(cpu_kernels, causal, head_dim):
    """aten._scaled_dot_product_flash_attention and, through its autograd formula, its backward: (batch, heads,
    seqlen, headdim), causal top-left as SDPA, GQA; out, LSE (batch, heads, seqlen) and dQ, dK, dV."""
    q = randn(2, 4, 37, head_dim, dtype=torch.float16)
    k, v = (randn(2, 2, 37, head_dim, dtype=torch.float16) for _ in range(2))
    dout = randn(2, 4, 37, head_dim, dtype=torch.float16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    result = torch.ops.aten._scaled_dot_product_flash_attention(*leaves, 0.0, causal)
    out, lse = result[0], result[1]
    assert out.shape == q.shape and lse.shape == (2, 4, 37) and lse.dtype == torch.float32
    got = [out.detach(), *torch.autograd.grad(out, leaves, dout)]

    def run(upcast):
        inputs = [(t.double() if upcast else t).transpose(1, 2).clone().requires_grad_() for t in (q, k, v)]
        o, l = reference.attention(*inputs, causal=causal, bottom_right=False, upcast=upcast)
        grads = torch.autograd.grad(o, inputs, dout.transpose(1, 2).to(o.dtype))
        return [o.detach().transpose(1, 2), *(g.transpose(1, 2) for g in grads)], l
    (want, want_lse), (base, _) = run(True), run(False)
    _check(got, want, base)
    torch.testing.assert_close(lse, want_lse.float(), atol=1e-3, rtol=1e-3)


def test_varlen_flash_op(cpu_kernels):
    """aten._flash_attention_forward on packed sequences (what torch.nn.attention.varlen calls) and its backward."""
    cu = torch.tensor([0, 9, 30], dtype=torch.int64, device=DEVICE)
    q, k, v = (randn(30, 2, 32, dtype=torch.float16) for _ in range(3))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse, *_ = torch.ops.aten._flash_attention_forward(*leaves, cu, cu, 21, 21, 0.0, True, False)
    assert lse.shape == (2, 30)
    dout = randn(30, 2, 32, dtype=torch.float16)
    got = [out.detach(), *torch.autograd.grad(out, leaves, dout)]
    mine = [t.clone().requires_grad_() for t in (q, k, v)]
    o = flashtile.flash_attn_varlen_func(*mine, cu.int(), cu.int(), 21, 21, causal=True)
    for g, e in zip(got, [o.detach(), *torch.autograd.grad(o, mine, dout)]):
        assert torch.equal(g, e)


def test_removing_the_kernels_gives_the_op_back():
    if DEVICE != "cpu":
        pytest.skip("the CPU registration stands in for the CUDA one where there is no GPU")
    q = randn(1, 2, 8, 16, dtype=torch.float16)
    handle = flashtile.sdpa.register_kernels("CPU")
    torch.ops.aten._scaled_dot_product_flash_attention(q, q, q)
    handle.remove()
    with pytest.raises((NotImplementedError, RuntimeError)):  # aten has no CPU kernel of its own for it
        torch.ops.aten._scaled_dot_product_flash_attention(q, q, q)


def test_refused_options_name_themselves(cpu_kernels):
    q = randn(1, 2, 8, 16, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.1, False)


def test_enable_and_restore():
    assert not flashtile.sdpa.is_enabled()
    with flashtile.sdpa.enabled():
        assert flashtile.sdpa.is_enabled()
        if hasattr(torch.nn.attention, "current_flash_attention_impl"):
            assert torch.nn.attention.current_flash_attention_impl() == flashtile.sdpa.NAME
    assert not flashtile.sdpa.is_enabled()


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_runs_flashtile_kernels_and_restores(causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (randn(2, 8, 1024, 128, dtype=torch.bfloat16) for _ in range(3))

    def kernels():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.cuda.synchronize()
        return out, {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    native, native_kernels = kernels()
    with flashtile.sdpa.enabled():
        ours, our_kernels = kernels()
    restored, restored_kernels = kernels()
    assert any("flash_fwd_hopper" in n or "flash_fwd_kernel" in n for n in our_kernels), our_kernels
    assert restored_kernels == native_kernels and torch.equal(restored, native)
    torch.testing.assert_close(ours, native, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_model_on_sdpa_trains_on_flashtile_within_pytorchs_error(causal):
    """A block that calls F.scaled_dot_product_attention (8 heads of 128, 1024 tokens), bf16, one forward and
    backward under flashtile.sdpa.enabled(): the profiler shows flashtile's forward and backward kernels, and the
    output and every gradient (the input's, each weight's) are within 2x of PyTorch's own bf16 flash attention's error
    against the same block in float32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj = torch.nn.Linear(1024, 3 * 1024), torch.nn.Linear(1024, 1024)

        def forward(self, x):
            q, k, v = self.qkv(x).view(*x.shape[:2], 3, 8, 128).permute(2, 0, 3, 1, 4)
            return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).flatten(2))
    torch.manual_seed(0)
    truth = Block().cuda()
    x, g = (torch.randn(2, 1024, 1024, device="cuda") for _ in range(2))

    def run(model, dtype, backend, flashtile_on):
        model = model.to(dtype)
        inputs = x.detach().to(dtype).clone().requires_grad_()  # a leaf of its own in every dtype
        model.zero_grad()
        on = flashtile.sdpa.enabled() if flashtile_on else contextlib.nullcontext()
        with on, sdpa_kernel(backend), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            y = model(inputs)
            (y.float() * g).sum().backward()
            torch.cuda.synchronize()
        names = {e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA}
        return [y, inputs.grad] + [w.grad for w in model.parameters()], names
    want, _ = run(truth, torch.float32, SDPBackend.MATH, False)
    theirs, _ = run(copy.deepcopy(truth), torch.bfloat16, SDPBackend.FLASH_ATTENTION, False)
    ours, names = run(copy.deepcopy(truth), torch.bfloat16, SDPBackend.FLASH_ATTENTION, True)
    assert any("flash_fwd_hopper" in n for n in names) and any("bwd_preprocess" in n for n in names), names
    for i, (w, t, o) in enumerate(zip(want, theirs, ours)):
        error = lambda a: (a.float() - w.float()).abs().max().item()  # noqa: E731
        assert error(o) <= 2 * error(t) + 1e-3 * w.abs().max().item(), i
