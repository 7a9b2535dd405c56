"""GPU tier: the sm90 backward (kernels/hopper/bwd.py in one pass with dQ by the copy engine's reduce-add, or after
kernels/hopper/bwd_dq.py; D=256 by kernels/hopper/bwd_split.py after it)
against the float64 reference, beside PyTorch's own error."""
import dataclasses

import pytest
import torch
from helpers import DTYPE_IDS, randn
from test_gpu_bwd import assert_graph_replays_like_eager, check

import flashtile
from flashtile import configs, dispatch

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def hopper_backward(monkeypatch):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the kernel is for sm90")
    monkeypatch.setattr(configs, "BWD_BACKEND", "auto")


def _with_single_pass(single):
    """configs.BWD_HOPPER with the D=64 and D=128 entries in one pass or two kernels (D=256 has two kernels only)."""
    return {key: c if c.split_gradients else dataclasses.replace(c, single_pass=single)
            for key, c in configs.BWD_HOPPER.items()}


@pytest.fixture(params=["single-pass", "two-kernels"])
def bwd_path(request, monkeypatch):
    """Either design of the sm90 backward at D=64 and D=128 (configs.HopperBwdConfig.single_pass)."""
    monkeypatch.setattr(configs, "BWD_HOPPER", _with_single_pass(request.param == "single-pass"))
    return request.param


def test_taken_for_the_shapes_it_covers():
    for d in (64, 128, 256):
        q, k = randn(1, 256, 4, d, dtype=torch.bfloat16), randn(1, 256, 2, d, dtype=torch.bfloat16)
        assert dispatch.takes_hopper_backward(q, k, k, q, (-1, -1), False)
        assert dispatch.takes_hopper_backward(q, k, k, q, (-1, 0), False)
        assert not dispatch.takes_hopper_backward(q, k, k, q, (128, 0), False)
    assert not dispatch.takes_hopper_backward(q[..., :96], k[..., :96], k[..., :96], q[..., :96], (-1, -1), False)


SHAPES = [(1, 1024, 1024, 2, 2), (2, 1000, 3001, 8, 2), (2, 3001, 1000, 4, 4), (1, 4096, 4096, 4, 1),
          (3, 17, 113, 2, 1)]


def shape_id(s):
    return f"b{s[0]}-q{s[1]}-k{s[2]}-h{s[3]}-hk{s[4]}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
def test_gradients(head_dim, shape, causal, dtype, bwd_path):
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    check(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal)


@pytest.mark.parametrize("with_dlse", [False, True], ids=["no-dlse", "dlse"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
def test_gradients_into_given_tensors_and_the_delta_used(head_dim, with_dlse, bwd_path):
    """test_bwd.check_gradients_into_given_tensors on the sm90 backward (the flash_attn shim's call), each design."""
    from test_bwd import check_gradients_into_given_tensors
    q, dout = (randn(2, 1000, 8, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 1000, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    check_gradients_into_given_tensors(q, k, v, dout, False, with_dlse, False, False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_gradients_d256(shape, causal, dtype):
    """D=256: the dQ kernel, then one warpgroup per gradient (kernels/hopper/bwd_split.py)."""
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    check(batch, seqlen_q, seqlen_k, nheads, nheads_k, 256, dtype, causal)


@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
def test_forward_backward_replay_in_cuda_graph(head_dim):
    """The launches of the deterministic sm90 backward (dQ writing delta, then dK/dV) inside a captured step:
    replayed on new inputs, bitwise equal to eager (neither uses atomics)."""
    q, dout = (randn(2, 2048, 8, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 2048, 2, head_dim, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    q.requires_grad_()

    def step():
        out = flashtile.flash_attn_func(q, k, v, causal=True, deterministic=True)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    assert_graph_replays_like_eager(step, (q, k, v, dout))


@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_single_pass_in_cuda_graph(causal, head_dim, monkeypatch):
    """The single-pass backward (delta and zeroed dQ, dK/dV with dQ atomics, dQ cast) captured and replayed on new
    inputs: dK, dV bitwise equal to eager, dQ within float32 reordering of it."""
    monkeypatch.setattr(configs, "BWD_HOPPER", _with_single_pass(True))
    q, dout = (randn(2, 2048, 8, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 2048, 2, head_dim, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    q.requires_grad_()

    def step():
        out = flashtile.flash_attn_func(q, k, v, causal=causal)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        for t in (q, k, v, dout):
            t.copy_(randn(*t.shape, dtype=t.dtype))
    graph.replay()
    eager = step()
    for i, (got, want) in enumerate(zip(captured, eager)):
        if i == 1:
            torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)
        else:
            assert torch.equal(got, want)


@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_deterministic_is_bitwise_stable(causal, head_dim, monkeypatch):
    """With single_pass on, deterministic=True still takes the two kernels without atomics: equal run to run."""
    monkeypatch.setattr(configs, "BWD_HOPPER", _with_single_pass(True))
    q, dout = (randn(2, 3000, 8, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 3000, 2, head_dim, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    q.requires_grad_()
    runs = []
    for _ in range(3):
        out = flashtile.flash_attn_func(q, k, v, causal=causal, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), dout))
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(run, runs[0]))


@pytest.mark.parametrize("dq_kernel", ["gluon", "gluon-128keys"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES[1:3] + SHAPES[4:], ids=shape_id)
def test_either_dq_tile(shape, causal, dq_kernel, monkeypatch):
    """The dQ half of the sm90 backward (two kernels) with either tile of the Gluon dQ kernel
    (configs.HopperBwdConfig.dq_hopper)."""
    dq_hopper = {"gluon": configs.HopperDqConfig(), "gluon-128keys": configs.HopperDqConfig(block_n=128)}[dq_kernel]
    table = {key: dataclasses.replace(c, dq_hopper=dq_hopper, single_pass=False) if key[0] == 128 else c
             for key, c in configs.BWD_HOPPER.items()}
    monkeypatch.setattr(configs, "BWD_HOPPER", table)
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    check(batch, seqlen_q, seqlen_k, nheads, nheads_k, 128, torch.bfloat16, causal)


@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lse_gradient(causal, deterministic, head_dim):
    """A loss of out and the returned LSE at a size the sm90 backward takes (delta - dLSE from a preprocess launch,
    into the one pass or the dQ kernel): dQ, dK, dV within 2x of bf16 PyTorch's error against float64."""
    from test_bwd import assert_lse_gradients_close
    q = randn(1, 2048, 4, head_dim, dtype=torch.bfloat16)
    k, v = (randn(1, 2048, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    assert_lse_gradients_close(q, k, v, randn(1, 2048, 4, head_dim, dtype=torch.bfloat16),
                               torch.randn(1, 4, 2048, device="cuda"), causal, deterministic)
