"""GPU tier: the sm90 backward (kernels/bwd_dq_hopper.py, then kernels/bwd_hopper.py; forced with
FLASHTILE_BWD_BACKEND=hopper) against the float64 reference, beside PyTorch's own error."""
import dataclasses

import pytest
import torch

import flashtile
from flashtile import configs, ops
from helpers import DTYPE_IDS, randn
from test_gpu_bwd import assert_graph_replays_like_eager, check

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def hopper_backward(monkeypatch):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the kernel is for sm90")
    monkeypatch.setattr(configs, "BWD_BACKEND", "hopper")


def test_taken_for_the_shapes_it_covers():
    q, k = randn(1, 256, 4, 128, dtype=torch.bfloat16), randn(1, 256, 2, 128, dtype=torch.bfloat16)
    assert ops._hopper_bwd(q, k, k, q, (-1, -1), None)
    assert ops._hopper_bwd(q, k, k, q, (-1, 0), None)
    assert not ops._hopper_bwd(q[..., :64], k[..., :64], k[..., :64], q[..., :64], (-1, -1), None)
    assert not ops._hopper_bwd(q, k, k, q, (128, 0), None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 1024, 1024, 2, 2), (2, 1000, 3001, 8, 2), (2, 3001, 1000, 4, 4),
                                   (1, 4096, 4096, 4, 1), (3, 17, 113, 2, 1)],
                         ids=lambda s: f"b{s[0]}-q{s[1]}-k{s[2]}-h{s[3]}-hk{s[4]}")
def test_gradients(shape, causal, dtype):
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    check(batch, seqlen_q, seqlen_k, nheads, nheads_k, 128, dtype, causal)


def test_forward_backward_replay_in_cuda_graph():
    """Both launches of the sm90 backward (dQ writing delta, then dK/dV) inside a captured step:
    replayed on new inputs, bitwise equal to eager (neither uses atomics)."""
    q, dout = (randn(2, 2048, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 2048, 2, 128, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    q.requires_grad_()

    def step():
        out = flashtile.flash_attn_func(q, k, v, causal=True)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    assert_graph_replays_like_eager(step, (q, k, v, dout))


@pytest.mark.parametrize("dq_kernel", ["portable", "gluon", "gluon-128keys"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 1000, 3001, 8, 2), (2, 3001, 1000, 4, 4), (3, 17, 113, 2, 1)],
                         ids=lambda s: f"b{s[0]}-q{s[1]}-k{s[2]}-h{s[3]}-hk{s[4]}")
def test_either_dq_kernel(shape, causal, dq_kernel, monkeypatch):
    """The dQ half of the sm90 backward by each of its two kernels (configs.HopperBwdConfig.dq_hopper)."""
    dq_hopper = {"portable": None, "gluon": configs.HopperDqConfig(),
                 "gluon-128keys": configs.HopperDqConfig(block_n=128)}[dq_kernel]
    table = {key: dataclasses.replace(c, dq_hopper=dq_hopper) for key, c in configs.BWD_HOPPER.items()}
    monkeypatch.setattr(configs, "BWD_HOPPER", table)
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    check(batch, seqlen_q, seqlen_k, nheads, nheads_k, 128, torch.bfloat16, causal)
