"""Shared test tools: inputs, the low-precision PyTorch baseline, the error rule, NaN-poisoned outputs."""
import contextlib
import math
from pathlib import Path

import torch
import torch.nn.functional as F

import flashtile
from flashtile import reference

ROOT = Path(__file__).resolve().parents[1]  # the repository
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The small absolute slack added to 2x PyTorch's own error, per dtype. fp32: ~32 ulp at 1.0; the worst
# ratio err / (2 x PyTorch's + 1e-6) seen over 60 fp32 draws at D=256 was 0.94, so 1e-6 was flaky.
ATOL = {torch.float16: 1e-4, torch.bfloat16: 1e-3, torch.float32: 4e-6}
DTYPE_IDS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def slack(ref, dtype, scaled=False):
    """What the error rule adds to 2x PyTorch's error: ATOL (times the reference's largest magnitude when
    ``scaled``), and at least one unit in the last place of ``dtype`` there. Rounding the exact result to the
    dtype alone may cost half of it, and PyTorch's result may have happened to round the right way: a 17x17
    fp16 dV once measured one ulp (0.0039) against PyTorch's 0.00098."""
    top = ref.abs().max().item()
    atol = ATOL[dtype] * (max(1.0, top) if scaled else 1.0)
    return max(atol, torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(top)) if top > 0 else 0.0)


def randn(*shape, dtype, scale=1.0, device=DEVICE):
    return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype)


@contextlib.contextmanager
def poisoned_outputs():
    """torch.empty fills floats with NaN inside this block, so an element the kernel never writes shows."""
    was = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


@contextlib.contextmanager
def value_checks():
    """The debug mode of the index-value checks (flashtile.set_value_checks(True)): on the GPU too, where by default
    values are not read back."""
    flashtile.set_value_checks(True)
    try:
        yield
    finally:
        flashtile.set_value_checks(None)


def torch_attention(q, k, v, causal=False, window_size=(-1, -1), bottom_right=True, softmax_scale=None):
    """PyTorch's own SDPA in the inputs' low precision: its causal flag where that is the same mask
    (so a GPU runs its flash kernel), the mask given explicitly otherwise."""
    plain = window_size == (-1, -1) and (not causal or not bottom_right or q.shape[1] == k.shape[1])
    mask = None if plain else reference.allowed_keys(q.shape[1], k.shape[1], causal, window_size,
                                                     bottom_right, q.device)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, is_causal=plain and causal, scale=softmax_scale,
                                         enable_gqa=True)
    return out.transpose(1, 2).nan_to_num(0.0)


def assert_attention_close(out, ref, baseline, lse=None, ref_lse=None):
    """out's max error against the float64 ref is at most 2x PyTorch's (baseline) plus a small atol;
    LSE matches to float32 rounding and is -inf exactly where the reference's is."""
    assert not out.isnan().any(), "NaN in the output"
    err = (out.double() - ref).abs().max().item()
    base = (baseline.double() - ref).abs().max().item()
    bound = 2 * base + slack(ref, out.dtype)
    assert err <= bound, f"max error {err:.3g} > 2 x PyTorch's {base:.3g} + atol"
    if lse is not None:
        assert not lse.isnan().any(), "NaN in the LSE"
        empty = ref_lse == float("-inf")
        assert torch.equal(lse == float("-inf"), empty), "LSE is -inf on different rows than the reference"
        lse_err = (lse[~empty].double() - ref_lse[~empty].double()).abs().max().item() if (~empty).any() else 0
        assert lse_err <= 1e-3 + 1e-5 * ref_lse[~empty].abs().max().item(), f"LSE error {lse_err:.3g}"


def varlen_inputs(seqlens_q, seqlens_k, nheads, nheads_k, head_dim, dtype):
    cu_q = torch.tensor([0] + seqlens_q, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)
    cu_k = torch.tensor([0] + seqlens_k, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)
    q = randn(sum(seqlens_q), nheads, head_dim, dtype=dtype)
    k = randn(sum(seqlens_k), nheads_k, head_dim, dtype=dtype)
    v = randn(sum(seqlens_k), nheads_k, head_dim, dtype=dtype)
    return q, k, v, cu_q, cu_k


def torch_attention_varlen(q, k, v, cu_q, cu_k, causal=False, window_size=(-1, -1)):
    outs = []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        qb, kb, vb = q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]]
        if kb.shape[1] == 0 or qb.shape[1] == 0:
            outs.append(torch.zeros_like(qb[0]))
            continue
        outs.append(torch_attention(qb, kb, vb, causal, window_size)[0])
    return torch.cat(outs, 0)


def guarded(*shape, dtype=torch.float16):
    """A fresh normal tensor of ``shape`` in the middle of a buffer three times its size whose rest is NaN, and that
    buffer: a read past either end of the tensor shows as NaN, a write as a changed guard."""
    n = 1
    for s in shape:
        n *= s
    buffer = torch.full((3 * n, ), float("nan"), dtype=dtype, device=DEVICE)
    tensor = buffer[n:2 * n].view(*shape)
    tensor.copy_(randn(*shape, dtype=dtype))
    return tensor, buffer


def guards_intact(buffer):
    """Whether the NaN guards of a ``guarded`` buffer are untouched."""
    n = buffer.numel() // 3
    return bool(buffer[:n].isnan().all() and buffer[2 * n:].isnan().all())
