"""The portable backward (kernels/portable/bwd.py) and the autograd path around every backward: gradients, the
LSE's gradient, torch.compile. CPU tier under the Triton interpreter (fp16/fp32); GPU tier (`pytest -m gpu`) at real
sizes, with inductor and a short training run."""
import pytest
import torch
import torch.nn.functional as F
from bwd_checks import (
    assert_close_as_pytorch,
    assert_grads_close,
    assert_graph_replays_like_eager,
    assert_lse_gradients_close,
    check,
    check_gradients_into_given_tensors,
    check_sinks,
    gradients,
    grads_of_loss,
)
from helpers import (
    DEVICE,
    DTYPE_IDS,
    assert_attention_close,
    guarded,
    poisoned_outputs,
    randn,
    slack,
    torch_attention_varlen,
    varlen_inputs,
)

import flashtile
from flashtile import configs, ops, reference


def _cases():
    for seqlens in [(1, 1), (17, 17), (63, 63), (113, 203), (203, 113)]:
        for head_dim in [40, 64, 96, 128, 256]:
            yield pytest.param(seqlens, head_dim, torch.float16, id=f"q{seqlens[0]}k{seqlens[1]}-d{head_dim}-fp16")
    for seqlens in [(17, 17), (113, 203)]:
        yield pytest.param(seqlens, 64, torch.float32, id=f"q{seqlens[0]}k{seqlens[1]}-d64-fp32")
        for head_dim in (59, 111):  # padded to 64 and 112 (ops.flash_attention)
            yield pytest.param(seqlens, head_dim, torch.float16, id=f"q{seqlens[0]}k{seqlens[1]}-d{head_dim}-fp16")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens, head_dim, dtype", list(_cases()))
def test_gradients(seqlens, head_dim, dtype, causal):
    check(2 if seqlens[0] < 100 else 1, *seqlens, 2, 2, head_dim, dtype, causal)


@pytest.mark.parametrize("nheads_k", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa_mqa_gradients(nheads_k, causal):
    check(1, 70, 130, 6, nheads_k, 64, torch.float16, causal)


@pytest.mark.parametrize("window_size", [(16, 0), (-1, 5), (20, 9)], ids=lambda w: f"w{w[0]}_{w[1]}")
def test_window_gradients(window_size):
    check(1, 120, 150, 2, 1, 64, torch.float16, window_size=window_size)


def test_rows_with_nothing_to_attend_get_zero_gradient():
    dq = check(1, 90, 30, 2, 2, 64, torch.float16, causal=True)[1]
    assert torch.equal(dq[:, :60], torch.zeros_like(dq[:, :60]))


def test_large_logits_gradients():
    check(1, 100, 100, 2, 2, 64, torch.float16, causal=True, scale=30.0)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_keys_past_the_end_give_no_nan_in_dq(deterministic):
    """The padding of a K/V tile past seqlen_k scores 0, far above an LSE of -12: in fp16 its dS overflows,
    and inf times the zero rows of K made dQ NaN (flash-attn's bwd_overflow tests). The exact dQ is 0."""
    q = torch.ones(1, 1, 1, 16, dtype=torch.float16, device=DEVICE)
    k = torch.full((1, 1, 1, 16), -3.0, dtype=torch.float16, device=DEVICE)
    v = torch.ones(1, 1, 1, 16, dtype=torch.float16, device=DEVICE)
    _, dq, dk, dv = gradients(lambda q, k, v: flashtile.flash_attn_func(q, k, v, deterministic=deterministic),
                              (q, k, v), torch.ones_like(q))
    assert torch.equal(dq, torch.zeros_like(dq)) and torch.equal(dk, torch.zeros_like(dk))
    assert torch.equal(dv, torch.ones_like(dv))


def negative_scores(q, k):
    """q with positive entries, k with negative ones: every score is far below 0 (about -50 at D=32), so the
    LSE is too, and the zero padding past seqlen_k would get P = e^50 in a tile that did not mask it."""
    return q.abs() * 5, -k.abs() * 3


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", [(1, 1), (17, 17), (63, 70)], ids=lambda n: f"q{n[0]}k{n[1]}")
def test_large_negative_scores_gradients(seqlens, causal, deterministic):
    """flash-attn's test_flash_attn_bwd_overflow, made certain to overflow: lengths that leave the last K/V
    tile ragged, scores of about -50."""
    check(2, *seqlens, 3, 3, 32, torch.float16, causal, deterministic=deterministic, inputs=negative_scores)


def test_large_negative_scores_varlen_gradients():
    q, k, v, cu_q, cu_k = varlen_inputs([3, 17, 40], [5, 33, 40], 2, 1, 32, torch.float16)
    q, k = negative_scores(q, k)
    dout = randn(*q.shape, dtype=torch.float16)
    ours = gradients(lambda q, k, v: flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40), (q, k, v), dout)
    ref = gradients(lambda q, k, v: reference.attention_varlen(q, k, v, cu_q, cu_k)[0], (q, k, v), dout.double())
    base = gradients(lambda q, k, v: torch_attention_varlen(q, k, v, cu_q, cu_k), (q, k, v), dout)
    assert_grads_close(ours, ref, base)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_varlen_gradients(causal, deterministic):
    seqlens_q, seqlens_k = [5, 0, 70, 33, 1], [9, 12, 70, 130, 0]
    q, k, v, cu_q, cu_k = varlen_inputs(seqlens_q, seqlens_k, 4, 2, 64, torch.float16)
    dout = randn(*q.shape, dtype=torch.float16)
    ours = gradients(lambda q, k, v: flashtile.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 70, 130, causal=causal, deterministic=deterministic), (q, k, v), dout)
    ref = gradients(lambda q, k, v: reference.attention_varlen(q, k, v, cu_q, cu_k, causal=causal)[0], (q, k, v),
                    dout.double())
    base = gradients(lambda q, k, v: torch_attention_varlen(q, k, v, cu_q, cu_k, causal), (q, k, v), dout)
    assert_grads_close(ours, ref, base)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_varlen_rows_past_the_last_sequence_get_zero_gradient(deterministic):
    """Query rows past cu_seqlens_q[-1] get out = 0 and dq = 0, key rows past cu_seqlens_k[-1] dk = dv = 0; every
    other row is written (NaN-filled buffers), keys of a sequence without queries with zeros."""
    q, k, v, cu_q, cu_k = varlen_inputs([30, 0, 7], [20, 9, 50], 2, 2, 32, torch.float16)
    q_pad = torch.cat([q, randn(19, 2, 32, dtype=torch.float16)])
    k_pad, v_pad = (torch.cat([t, randn(11, 2, 32, dtype=torch.float16)]) for t in (k, v))
    dout = randn(*q_pad.shape, dtype=torch.float16)
    with poisoned_outputs():
        out, dq, dk, dv = gradients(lambda q, k, v: flashtile.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, 30, 50, deterministic=deterministic), (q_pad, k_pad, v_pad), dout)
    for grad, used in ((out, 37), (dq, 37), (dk, 79), (dv, 79)):
        assert torch.equal(grad[used:], torch.zeros_like(grad[used:]))
    assert torch.equal(dk[20:29], torch.zeros_like(dk[20:29])) and torch.equal(dv[20:29], torch.zeros_like(dv[20:29]))
    ref = gradients(lambda q, k, v: reference.attention_varlen(q, k, v, cu_q, cu_k)[0], (q, k, v),
                    dout[:37].double())
    base = gradients(lambda q, k, v: torch_attention_varlen(q, k, v, cu_q, cu_k), (q, k, v), dout[:37])
    assert_grads_close((out[:37], dq[:37], dk[:79], dv[:79]), ref, base)


def _slopes(nheads, batch=None):
    """ALiBi's slopes for nheads heads (2^(-8i/nheads)), per sequence scaled differently when batch is given."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, nheads + 1, dtype=torch.float32) / nheads)
    if batch is not None:
        slopes = slopes * torch.linspace(0.5, 2.0, batch)[:, None]
    return slopes.to(DEVICE)


@pytest.mark.parametrize("mods", ["softcap", "alibi", "alibi-bh", "both"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_softcap_alibi_gradients(mods, causal, deterministic):
    """flash-attn's softcap (through tanh's derivative) and ALiBi (a bias: no gradient of its own): out, dq,
    dk, dv against float64 autograd through the reference with the same modifications; GQA, Nq != Nk."""
    batch, nheads = 2, 4
    kwargs = dict(softcap=3.0 if mods in ("softcap", "both") else 0.0)
    if mods != "softcap":
        kwargs["alibi_slopes"] = _slopes(nheads, batch if mods == "alibi-bh" else None)
    q = randn(batch, 45, nheads, 64, dtype=torch.float16, scale=3.0)  # scores past the cap
    k, v = (randn(batch, 77, 2, 64, dtype=torch.float16) for _ in range(2))
    dout = randn(batch, 45, nheads, 64, dtype=torch.float16)
    with poisoned_outputs():
        ours = gradients(lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic,
                                                                   **kwargs), (q, k, v), dout)
    ref = gradients(lambda q, k, v: reference.attention(q, k, v, causal=causal, **kwargs)[0], (q, k, v),
                    dout.double())
    base = gradients(lambda q, k, v: reference.attention(q, k, v, causal=causal, upcast=False, **kwargs)[0],
                     (q, k, v), dout)
    assert_grads_close(ours, ref, base)
    plain = flashtile.flash_attn_func(q, k, v, causal=causal)
    assert (plain - ours[0]).abs().max() > 0.05, "the modification changed nothing: the test would not see it"


def test_softcap_alibi_varlen():
    """The same on packed sequences: slopes per sequence (batch, nheads), softcap on top."""
    q, k, v, cu_q, cu_k = varlen_inputs([5, 40, 1], [33, 40, 9], 4, 2, 64, torch.float16)
    slopes = _slopes(4, 3)
    out = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, causal=True, softcap=4.0, alibi_slopes=slopes)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(3):
        args = (q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]])
        kw = dict(causal=True, softcap=4.0, alibi_slopes=slopes[b])
        ref, _ = reference.attention(*args, **kw)
        base, _ = reference.attention(*args, upcast=False, **kw)
        err = (out[cq[b]:cq[b + 1]].double() - ref[0]).abs().max().item()
        assert err <= 2 * (base.double() - ref).abs().max().item() + slack(ref, torch.float16)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("uses", ["lse", "out+lse"])
def test_lse_gradient(uses, causal, deterministic):
    """The LSE is differentiable: a loss of the LSE alone, or of out and LSE, gives dQ, dK, dV within 2x of PyTorch's
    own error against float64 autograd through the reference; GQA, Nq != Nk, a row with no key (causal: LSE = -inf
    there, no gradient)."""
    q = randn(2, 37, 4, 32, dtype=torch.float16)
    k, v = (randn(2, 29, 2, 32, dtype=torch.float16) for _ in range(2))
    dout = randn(2, 37, 4, 32, dtype=torch.float16) if uses == "out+lse" else None
    assert_lse_gradients_close(q, k, v, dout, torch.randn(2, 4, 37, device=DEVICE), causal, deterministic)


def test_varlen_lse_gradient():
    """The same through flash_attn_varlen_func: its LSE (nheads, total_q) takes a gradient per packed row."""
    from flashtile.reference import attention_varlen
    cu = torch.tensor([0, 7, 20], dtype=torch.int32, device=DEVICE)
    q, k, v = (randn(20, 2, 32, dtype=torch.float16) for _ in range(3))
    dlse = torch.randn(2, 20, device=DEVICE)

    def ours(q, k, v):
        _, lse, _ = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, 13, 13, causal=True, return_attn_probs=True)
        return (lse * dlse).sum()
    got = grads_of_loss(ours, (q, k, v))
    ref = grads_of_loss(lambda q, k, v: (attention_varlen(q, k, v, cu, cu, causal=True)[1].double() * dlse).sum(),
                         (q, k, v), True)
    base = grads_of_loss(lambda q, k, v: (attention_varlen(q, k, v, cu, cu, causal=True, upcast=False)[1]
                                           * dlse).sum(), (q, k, v))
    for g, r, b in zip(got, ref, base):
        assert (g.double() - r).abs().max().item() <= 2 * (b.double() - r).abs().max().item() + 1e-2


def test_deterministic_flag_is_bitwise_reproducible():
    args = (1, 200, 200, 4, 2, 64, torch.float16)
    q, k, v, dout = (randn(1, 200, h, 64, dtype=torch.float16) for h in (4, 2, 2, 4))
    runs = [gradients(lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=True, deterministic=True),
                      (q, k, v), dout) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    check(*args, causal=True, deterministic=True)


def test_sdpa_gradients():
    q, k, v, dout = (randn(2, h, 50, 64, dtype=torch.float16) for h in (4, 2, 2, 4))
    ours = gradients(lambda q, k, v: flashtile.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                     (q, k, v), dout)
    ref = gradients(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True), (q.double(), k.double(), v.double()), dout.double())
    base = gradients(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True), (q, k, v), dout)
    assert_grads_close(ours, ref, base)


class Block(torch.nn.Module):
    """Attention with projections: what a model around flash_attn_func looks like."""

    def __init__(self, dim=64, nheads=2):
        super().__init__()
        self.nheads = nheads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.nheads, d // self.nheads).unbind(2)
        return self.proj(flashtile.flash_attn_func(q, k, v, causal=True).reshape(b, n, d))


def test_torch_compile_fullgraph_no_graph_break():
    torch.manual_seed(0)
    model = Block().to(DEVICE, torch.float16)
    x = randn(2, 40, 64, dtype=torch.float16)
    eager_out = model(x)
    eager_out.float().square().sum().backward()
    eager_grad = model.qkv.weight.grad.clone()
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    out.float().square().sum().backward()
    assert torch.equal(out, eager_out)
    assert torch.allclose(model.qkv.weight.grad, eager_grad, rtol=1e-3, atol=1e-3)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_opcheck():
    q, k, v = (randn(1, 20, 2, 32, dtype=torch.float16, device="cpu" if not torch.cuda.is_available() else "cuda")
               for _ in range(3))
    q.requires_grad_()
    torch.library.opcheck(ops.fwd, (q, k, v, None, None, 0, 0, 0.2, -1, 0, True, False, False))
    out, lse = (t.detach() for t in ops.fwd(q, k, v, None, None, 0, 0, 0.2, -1, 0, True, False, False))
    torch.library.opcheck(ops.bwd, (torch.randn_like(out), q.detach(), k, v, out, lse, None, None, 0, 0, 0.2, -1, 0,
                                    True, False))
    sinks = torch.randn(2, device=q.device, requires_grad=True)  # the op's autograd with the sinks' gradient
    torch.library.opcheck(ops.fwd, (q, k, v, None, None, 0, 0, 0.2, -1, 0, True, False, False, 0.0, None, sinks))


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_gradients_into_given_tensors_and_the_delta_used(deterministic):
    """check_gradients_into_given_tensors on the portable backward, dV's tensor strided."""
    q, dout = (randn(2, 37, 4, 32, dtype=torch.float16) for _ in range(2))
    k, v = (randn(2, 50, 2, 32, dtype=torch.float16) for _ in range(2))
    check_gradients_into_given_tensors(q, k, v, dout, deterministic, True, True, True)


def test_preprocess_subtracts_the_lse_gradient():
    """launch_preprocess(..., dlse=): delta − dLSE in the same launch, whatever strides the gradient comes with (a
    transposed one, an expanded one with stride 0), batch and packed."""
    from flashtile.kernels.portable.bwd import launch_preprocess
    out, dout = (randn(2, 77, 4, 64, dtype=torch.float16) for _ in range(2))
    lse = torch.randn(2, 4, 77, device=DEVICE)
    delta = launch_preprocess(out, dout, lse, None, 77)[0]
    transposed = torch.randn(2, 77, 4, device=DEVICE).transpose(1, 2)
    for dlse in (transposed, torch.randn(4, 1, device=DEVICE).expand(2, 4, 77)):
        torch.testing.assert_close(launch_preprocess(out, dout, lse, None, 77, dlse=dlse)[0], delta - dlse)
    cu = torch.tensor([0, 30, 77], dtype=torch.int32, device=DEVICE)
    packed_out, packed_dout = out[0], dout[0]
    packed_lse = torch.randn(4, 77, device=DEVICE)
    packed_delta = launch_preprocess(packed_out, packed_dout, packed_lse, cu, 47)[0]
    dlse = torch.randn(77, 4, device=DEVICE).t()
    torch.testing.assert_close(launch_preprocess(packed_out, packed_dout, packed_lse, cu, 47, dlse=dlse)[0],
                               packed_delta - dlse)


@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
def test_preprocess_zeroes_and_cast_scales_the_single_pass_dq(head_dim):
    """The launches around the sm90 single-pass backward: the preprocess writes delta and zeros over every row of
    the float32 head-major dQ (rows rounded up to whole tiles, here 128 ≥ 77, on a NaN-filled buffer), and the cast
    writes scale · dQacc (each tile's halves in the order the kernel's threads hold them) into a (batch, seqlen,
    nheads, headdim) dQ, no row past seqlen."""
    from flashtile.kernels.portable import bwd
    out, dout = (randn(2, 77, 3, 64, dtype=torch.float16) for _ in range(2))
    lse = torch.randn(2, 3, 77)
    real_empty = torch.empty
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(float("nan")))
        delta, zeros, parts = bwd.launch_preprocess(out, dout, lse, None, 77, zeroed=(2, 3, 128, 64))
    assert parts is None
    assert torch.equal(zeros, torch.zeros(2, 3, 128, 64))
    expected = (out.float() * dout.float()).sum(-1).transpose(1, 2)
    torch.testing.assert_close(delta, expected, atol=1e-3, rtol=1e-3)
    from flashtile.kernels.hopper.bwd import dq_tile_order
    full = torch.randn(2, 3, 128, head_dim)  # (batch, head, two 64-row Q tiles, head dim)
    halves = full.reshape(2, 3, 2, 64, 2, head_dim // 2).transpose(3, 4)  # each warpgroup's columns
    acc = dq_tile_order(halves).reshape(2, 3, 128, head_dim)
    assert not torch.equal(acc, full)
    dq = torch.full((2, 77, 3, head_dim), float("nan"), dtype=torch.float16)
    bwd.launch_dq_cast(acc, dq, 0.25)
    assert torch.equal(dq, (full[:, :, :77] * 0.25).half().transpose(1, 2))
    # packed: sequence b's rows from cu_seqlens[b], each at most dq_acc's 128 rows; rows past the last left alone
    cu = torch.tensor([0, 77, 210], dtype=torch.int32, device=DEVICE)  # the second sequence: 133 rows, 128 written
    dq = torch.full((215, 3, head_dim), float("nan"), dtype=torch.float16)
    bwd.launch_dq_cast(acc, dq, 0.25, cu)
    assert torch.equal(dq[:77], (full[0, :, :77] * 0.25).half().transpose(0, 1))
    assert torch.equal(dq[77:205], (full[1] * 0.25).half().transpose(0, 1)) and dq[205:].isnan().all()
    # a head dim below the tiles' (96 of 128 columns): dQ takes the first 96, nothing is written past its rows
    narrow = torch.full((2, 77, 3, head_dim - 32), float("nan"), dtype=torch.float16)
    bwd.launch_dq_cast(acc, narrow, 0.25)
    assert torch.equal(narrow, (full[:, :, :77, :head_dim - 32] * 0.25).half().transpose(1, 2))


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_offsets_never_leave_the_packed_tensors(deterministic):
    """With the value checks off (as on the GPU by default), cu_seqlens that decrease, start below 0 or end past
    the packed tensors give a wrong answer but no read outside q, k, v, dO: each sits between NaN guards, and out,
    LSE, dq, dk, dv stay finite (kernels/portable/packed.py clamps the offsets first)."""
    total_q, total_k, nheads, head_dim = 40, 50, 2, 32
    (q, _), (dout, _) = guarded(total_q, nheads, head_dim), guarded(total_q, nheads, head_dim)
    (k, _), (v, _) = guarded(total_k, 1, head_dim), guarded(total_k, 1, head_dim)
    cu_q = torch.tensor([-3, 25, 10, total_q + 9], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 60, 20, total_k + 2], dtype=torch.int32, device=DEVICE)
    flashtile.set_value_checks(False)
    try:
        out, dq, dk, dv = gradients(lambda q, k, v: flashtile.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, total_q, total_k, causal=True, deterministic=deterministic), (q, k, v), dout)
        _, lse, _ = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, total_q, total_k, return_attn_probs=True)
    finally:
        flashtile.set_value_checks(None)
    for name, t in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        assert t.isfinite().all(), name
    assert not lse.isnan().any()


# GPU tier (`pytest -m gpu`): the backward at real sizes, torch.compile with inductor, a short training run.
def _large_cases():
    for head_dim in (64, 128, 256):
        for seqlen in (1024, 4096, 8192):
            for dtype in (torch.bfloat16, torch.float16):
                if seqlen == 8192 and dtype != torch.bfloat16:
                    continue
                yield pytest.param(seqlen, head_dim, dtype, id=f"n{seqlen}-d{head_dim}-{DTYPE_IDS[dtype]}")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen, head_dim, dtype", list(_large_cases()))
def test_large_gradients(seqlen, head_dim, dtype, causal):
    check(1, seqlen, seqlen, 2, 2, head_dim, dtype, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_portable_backward_where_the_sm90_kernel_runs_by_default(monkeypatch, causal):
    """D=128 goes to kernels/hopper/bwd.py on sm90; FLASHTILE_BWD_BACKEND=portable must still
    give the one-launch portable backward there, and it must stay right."""
    monkeypatch.setattr(configs, "BWD_BACKEND", "portable")
    check(2, 4096, 4096, 4, 2, 128, torch.bfloat16, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("head_dim", [40, 96, 128], ids=lambda d: f"d{d}")
def test_ragged_gqa_gradients(head_dim, deterministic):
    check(2, 1000, 3001, 8, 2, head_dim, torch.bfloat16, True, deterministic=deterministic)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(1, 64), (17, 64), (1000, 64), (1000, 128), (2049, 128), (300, 256)],
                         ids=lambda s: f"n{s[0]}-d{s[1]}")
def test_large_negative_scores_gradients_at_real_sizes(shape, dtype, deterministic):
    """Scores of about -50 (negative_scores) with a ragged last K/V tile, on every backward the GPU picks: the
    portable one (dQ by bulk reduce-add at D=64 non-causal under 4k keys, Q-tile programs at D=128 under 2k keys)
    and the sm90 Gluon kernels (D=64 causal, D=128 from 2k keys, D=256 at every length)."""
    seqlen, head_dim = shape
    check(2, seqlen, seqlen, 3, 3, head_dim, dtype, False, deterministic=deterministic,
                   inputs=negative_scores)


@pytest.mark.gpu
def test_window_gradients_2k():
    check(1, 2048, 2048, 4, 1, 128, torch.bfloat16, False, window_size=(256, 0))


@pytest.mark.gpu
def test_varlen_gradients_2k():
    seqlens_q, seqlens_k = [1, 0, 2048, 300, 1500], [1, 129, 2048, 2000, 0]
    q, k, v, cu_q, cu_k = varlen_inputs(seqlens_q, seqlens_k, 8, 2, 128, torch.bfloat16)
    dout = randn(*q.shape, dtype=torch.bfloat16)
    ours = gradients(lambda q, k, v: flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2048, 2048, causal=True),
                     (q, k, v), dout)
    ref = gradients(lambda q, k, v: reference.attention_varlen(q, k, v, cu_q, cu_k, causal=True)[0], (q, k, v),
                    dout.double())
    base = gradients(lambda q, k, v: torch_attention_varlen(q, k, v, cu_q, cu_k, True), (q, k, v), dout)
    assert_grads_close(ours, ref, base)


@pytest.mark.gpu
def test_varlen_forward_backward_replay_in_cuda_graph():
    """Varlen kernels build their descriptors on the device, in memory from Triton's allocator: a captured
    step must replay on new inputs and match eager bitwise (deterministic dQ)."""
    seqlens = [5, 2048, 700]
    q, k, v, cu_q, cu_k = varlen_inputs(seqlens, seqlens, 8, 2, 128, torch.bfloat16)
    dout = randn(*q.shape, dtype=torch.bfloat16)
    for t in (q, k, v):
        t.requires_grad_()

    def step():
        out = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2048, 2048, causal=True, deterministic=True)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    assert_graph_replays_like_eager(step, (q, k, v, dout))


@pytest.mark.gpu
def test_deterministic_is_bitwise_reproducible():
    q, k, v, dout = (randn(2, 4096, h, 128, dtype=torch.bfloat16) for h in (16, 4, 4, 16))
    runs = [gradients(lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=True, deterministic=True),
                      (q, k, v), dout) for _ in range(3)]
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))


@pytest.mark.gpu
def test_torch_compile_inductor_fullgraph():
    torch.manual_seed(0)
    model = Block(dim=1024, nheads=8).cuda().to(torch.bfloat16)
    x = randn(4, 1024, 1024, dtype=torch.bfloat16)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    out.float().square().mean().backward()
    assert (out.float() - eager.float()).abs().max().item() < 2e-2


class TinyTransformer(torch.nn.Module):
    """Two pre-norm blocks; ``attention`` is flash_attn_func-shaped."""

    def __init__(self, attention, dim=256, nheads=4, layers=2, vocab=512):
        super().__init__()
        self.attention, self.nheads = attention, nheads
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict(dict(
            norm1=torch.nn.LayerNorm(dim), qkv=torch.nn.Linear(dim, 3 * dim), proj=torch.nn.Linear(dim, dim),
            norm2=torch.nn.LayerNorm(dim), mlp=torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                                                   torch.nn.Linear(4 * dim, dim))))
            for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        b, n, d = x.shape
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["norm1"](x)).view(b, n, 3, self.nheads, d // self.nheads).unbind(2)
            x = x + blk["proj"](self.attention(q, k, v).reshape(b, n, d))
            x = x + blk["mlp"](blk["norm2"](x))
        return self.head(x)


def sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=True).transpose(1, 2)


@pytest.mark.gpu
def test_training_losses_track_sdpa():
    losses = {}
    for name, attention in (("flashtile", lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=True)),
                            ("sdpa", sdpa_attention)):
        torch.manual_seed(0)
        model = TinyTransformer(attention).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.randint(0, 512, (8, 257), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        losses[name] = []
        for _ in range(30):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(data[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, 512), data[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    ours, theirs = torch.tensor(losses["flashtile"]), torch.tensor(losses["sdpa"])
    assert ours[-1] < ours[0] - 0.5, "the model did not learn"
    assert (ours - theirs).abs().max().item() < 0.1, (losses["flashtile"], losses["sdpa"])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softcap_alibi_gradients_bf16(causal):
    """softcap 30 and ALiBi together at D=128 in bf16 (the portable kernels take these calls on sm90 too)."""
    q = randn(2, 1024, 8, 128, dtype=torch.bfloat16, scale=2.0)
    k, v = (randn(2, 1536, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    dout = randn(2, 1024, 8, 128, dtype=torch.bfloat16)
    kwargs = dict(causal=causal, softcap=30.0, alibi_slopes=_slopes(8))
    ours = gradients(lambda q, k, v: flashtile.flash_attn_func(q, k, v, **kwargs), (q, k, v), dout)
    ref = gradients(lambda q, k, v: reference.attention(q, k, v, **kwargs)[0], (q, k, v), dout.double())
    base = gradients(lambda q, k, v: reference.attention(q, k, v, upcast=False, **kwargs)[0], (q, k, v), dout)
    assert_grads_close(ours, ref, base)


@pytest.mark.gpu
@pytest.mark.parametrize("backend, head_dim, causal, deterministic", [
    ("portable", 128, True, False), ("portable", 64, False, True), ("auto", 128, False, False),
    ("auto", 128, True, False), ("auto", 64, True, True), ("auto", 256, False, False)],
    ids=["portable-d128-causal", "portable-d64-deterministic", "hopper-d128-one-pass", "hopper-d128-causal",
         "hopper-d64-deterministic", "hopper-d256"])
def test_a_repeated_backward_replays_its_launches(backend, head_dim, causal, deterministic, monkeypatch):
    """A training loop repeats its shapes: from the second step every backward launch is replayed
    (kernels/common/replay.py) with the step's own tensors, and the gradients stay right."""
    from flashtile.kernels.common import replay
    if backend == "auto" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 backward")
    monkeypatch.setattr(configs, "BWD_BACKEND", backend)
    replayed = []
    launch = replay.Replay.launch
    monkeypatch.setattr(replay.Replay, "launch", lambda self, *a: (replayed.append(self), launch(self, *a))[1])
    for _ in range(2):
        replayed.clear()
        check(2, 300, 300, 4, 2, head_dim, torch.bfloat16, causal, deterministic=deterministic)
    assert replayed or not replay.REPLAY_OK


@pytest.mark.parametrize("case", [
    pytest.param((2, 17, 17, 4, 4, 64, torch.float32, False, {}), id="q17k17-d64-fp32-full"),
    pytest.param((2, 63, 63, 4, 2, 40, torch.float16, True, {}), id="q63k63-d40-fp16-causal-gqa"),
    pytest.param((1, 113, 203, 4, 1, 96, torch.float16, True, {"dlse": True}), id="q113k203-d96-fp16-causal-mqa-dlse"),
    pytest.param((2, 40, 17, 2, 2, 64, torch.float32, True, {}), id="q40k17-causal-empty-rows"),
    pytest.param((1, 33, 33, 2, 2, 64, torch.float16, False, {"scale": 8.0}), id="large-logits"),
    pytest.param((1, 33, 33, 2, 2, 64, torch.float32, True, {"sink_scale": 30.0}), id="sink-dominates"),
    pytest.param((1, 33, 33, 2, 2, 64, torch.float32, True, {"deterministic": True}), id="deterministic"),
])
def test_sinks(case):
    """learnable_sink on the portable kernels: O, LSE and every gradient (the sinks' too) against float64."""
    *shape, options = case
    check_sinks(*shape, **options)


def test_sinks_varlen():
    """learnable_sink on packed sequences, one without keys (its rows: O = 0, LSE = the sink) and one without
    queries: O, LSE, dq, dk, dv and the sinks' gradient against float64."""
    q, k, v, cu_q, cu_k = varlen_inputs([17, 0, 40, 9], [30, 12, 40, 0], 4, 2, 64, torch.float16)
    sinks = randn(4, dtype=torch.float32, scale=2.0)
    dout = randn(*q.shape, dtype=q.dtype)

    def ours(q, k, v, sinks):
        return flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, causal=True, return_attn_probs=True,
                                                learnable_sink=sinks)[:2]

    def ref(upcast):
        return lambda q, k, v, s: reference.attention_varlen(q, k, v, cu_q, cu_k, causal=True, upcast=upcast, sinks=s)
    with poisoned_outputs():
        out, lse = ours(q, k, v, sinks)
    want, want_lse = ref(True)(q, k, v, sinks)
    assert_attention_close(out, want, ref(False)(q, k, v, sinks)[0], lse, want_lse)
    torch.testing.assert_close(lse[:, 57:], sinks[:, None].expand(4, 9))  # the sequence without keys: the sink
    assert not out[57:].any()
    no_keys = torch.tensor([0, 0], dtype=torch.int32, device=DEVICE)  # no key at all; rows 5.. belong to no sequence
    out, lse, _ = flashtile.flash_attn_varlen_func(q[:8], k[:0], v[:0], cu_q[:2].clamp(max=5), no_keys, 5, 0,
                                                   return_attn_probs=True, learnable_sink=sinks)
    assert torch.equal(lse[:, :5], sinks[:, None].expand(4, 5)) and lse[:, 5:].isneginf().all() and not out.any()

    def loss(fn):
        return lambda *inputs: (fn(*inputs)[0].float() * dout.float()).sum()
    inputs = (q, k, v, sinks)
    assert_close_as_pytorch(("dq", "dk", "dv", "dsinks"), grads_of_loss(loss(ours), inputs),
                            grads_of_loss(loss(ref(True)), inputs, True), grads_of_loss(loss(ref(False)), inputs),
                            inputs)


def test_sinks_through_the_custom_op():
    """The ``fwd`` op (what torch.compile traces) gives the eager path's O, LSE and gradients, the sinks' included."""
    q, k, v = (randn(1, 17, 2, 32, dtype=torch.float32) for _ in range(3))
    sinks = randn(2, dtype=torch.float32)

    def op(q, k, v, sinks):
        return ops.fwd(q, k, v, None, None, 0, 0, 32 ** -0.5, -1, 0, True, False, False, 0.0, None, sinks)

    def eager(q, k, v, sinks):
        return flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True, learnable_sink=sinks)[:2]
    results = []
    for fn in (op, eager):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        out, lse = fn(*leaves)
        results.append([out, lse, *torch.autograd.grad(out.sum() + lse.sum(), leaves)])
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv", "dsinks"), *results):
        torch.testing.assert_close(a, b, msg=name)
