"""The polynomial exp2 of the Hopper forward (kernels/online_softmax.py, run on the GPU in
tests/test_gpu_fwd.py::test_exp2_on_fma_units): its PTX, and the same arithmetic in float32 here."""
import numpy as np
import pytest

from flashtile.kernels.online_softmax import EXP2_POLY, exp2_fma_ptx


def exp2_like_the_ptx(x):
    """The PTX's steps in float32: clamp at -127, n = floor(x) (the magic-number add rounding down), the
    polynomial in f = x - n, then n added to the exponent bits."""
    x = np.maximum(x.astype(np.float32), np.float32(-127))
    n = np.floor(x)
    f = (x - n).astype(np.float32)
    c1, c2, c3 = (np.float32(c) for c in EXP2_POLY)
    p = ((c3 * f + c2) * f + c1) * f + np.float32(1)
    bits = p.astype(np.float32).view(np.int32) + (n.astype(np.int32) << 23)
    return bits.view(np.float32)


def test_relative_error_below_bf16_and_fp16_rounding():
    x = np.random.default_rng(0).uniform(-120, 0, 200_000).astype(np.float32)
    x = np.concatenate([x, np.linspace(-3, 0, 30001, dtype=np.float32)])
    got = exp2_like_the_ptx(x).astype(np.float64)
    rel = np.abs(got / np.exp2(x.astype(np.float64)) - 1)
    assert rel.max() < 1e-4  # fp16 rounds P to 2^-11 = 4.9e-4


def test_masked_scores_give_exactly_zero_and_the_row_max_exactly_one():
    got = exp2_like_the_ptx(np.array([-np.inf, -1e30, -127, -300, 0], dtype=np.float32))
    assert got.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("every", [2, 4, 8])
def test_ptx_sends_one_in_every_to_the_fma_units(every):
    ptx = exp2_fma_ptx(every)
    assert ptx.count("ex2.approx") == every - 1 and ptx.count("fma.rn") == 3
    assert f"add.s32 ${every - 1}, p, t;" in ptx and f"max.ftz.f32 x, ${2 * every - 1}," in ptx
