"""The tile-level tracer: its results equal the reference, its HBM byte counts the closed forms."""
import numpy as np
import pytest
import torch

from flashtile import reference
from flashtile.trace import trace

B = 2  # bytes per element counted


def ref_attention(t, causal):
    q, k, v = (torch.from_numpy(t.result[n])[None, :, None] for n in ("q", "k", "v"))
    out, lse = reference.attention(q, k, v, causal=causal, bottom_right=False)
    return out[0, :, 0].numpy(), lse[0, 0].double().numpy()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("algo", ["naive", "fa1", "fa2"])
@pytest.mark.parametrize("sizes", [(8, 4, 2, 2), (7, 3, 2, 3), (9, 5, 4, 2)],
                         ids=lambda s: "n{}-d{}-bm{}-bn{}".format(*s))
def test_results_equal_reference(algo, sizes, causal):
    n, d, bm, bn = sizes
    t = trace(algo, n, d, bm, bn, causal)
    out, lse = ref_attention(t, causal)
    np.testing.assert_allclose(t.result["out"], out, rtol=1e-10, atol=1e-12)
    if "lse" in t.result:
        np.testing.assert_allclose(t.result["lse"], lse, rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sizes", [(8, 4, 2, 2), (7, 3, 2, 3), (9, 5, 4, 2)],
                         ids=lambda s: "n{}-d{}-bm{}-bn{}".format(*s))
def test_backward_equals_autograd_through_the_reference(sizes, causal):
    """fa2_bwd's dQ, dK, dV (and the forward's out it starts from) against float64 autograd of the naive oracle."""
    n, d, bm, bn = sizes
    t = trace("fa2_bwd", n, d, bm, bn, causal)
    q, k, v = (torch.from_numpy(t.result[name])[None, :, None].requires_grad_() for name in ("q", "k", "v"))
    out, _ = reference.attention(q, k, v, causal=causal, bottom_right=False)
    grads = torch.autograd.grad(out, (q, k, v), torch.from_numpy(t.result["dout"])[None, :, None])
    np.testing.assert_allclose(t.result["out"], out[0, :, 0].detach().numpy(), rtol=1e-10, atol=1e-12)
    for name, g in zip(("dq", "dk", "dv"), grads):
        np.testing.assert_allclose(t.result[name], g[0, :, 0].numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n, d, bm, bn", [(8, 4, 2, 2), (12, 4, 3, 3)])
def test_fa2_backward_counts(n, d, bm, bn, causal):
    """The FlashAttention-2 backward reads K, V and O once and writes dK, dV and D once; Q, dO, LSE and D are read
    and dQ read and written once per (Q tile, K/V tile) pair that the mask leaves (dO once more for D)."""
    t = trace("fa2_bwd", n, d, bm, bn, causal, itemsize=B)
    tr, tc = -(-n // bm), -(-n // bn)
    pairs = tr * (tr + 1) // 2 if causal else tr * tc  # square tiles when causal
    assert t.bytes_read("K") == t.bytes_read("V") == t.bytes_read("O") == n * d * B
    assert t.bytes_written("dK") == t.bytes_written("dV") == n * d * B
    assert t.bytes_read("Q") == t.bytes_read("dQ") == t.bytes_written("dQ") == pairs * bm * d * B
    assert t.bytes_read("dO") == n * d * B + pairs * bm * d * B
    assert t.bytes_read("LSE") == t.bytes_read("D") == pairs * bm * B and t.bytes_written("D") == n * B
    assert sum(1 for s in t.steps if s.kind == "skip") == tr * tc - pairs


def test_online_softmax_equals_softmax():
    t = trace("softmax", 9, 4, 2, 4, causal=True)
    expected = torch.softmax(torch.from_numpy(t.result["x"]), -1).numpy()
    np.testing.assert_allclose(t.result["y"], expected, rtol=1e-12, atol=1e-15)


def test_decode_equals_attention_over_the_whole_cache():
    t = trace("decode", 13, 4, 2, 2)
    q, k, v = (torch.from_numpy(t.result[n])[None, :, None] for n in ("q", "k", "v"))
    out, lse = reference.attention(q, k, v)
    np.testing.assert_allclose(t.result["out"], out[0, :, 0].numpy(), rtol=1e-10)
    np.testing.assert_allclose(t.result["lse"], lse[0, 0].double().numpy(), rtol=1e-6)


@pytest.mark.parametrize("n, d, bm, bn", [(8, 4, 2, 2), (12, 4, 4, 3)])
def test_fa1_counts(n, d, bm, bn):
    """FlashAttention-1 reads K and V once, and Q, O, m, l once per K/V tile; writes O, m, l once per K/V tile."""
    t = trace("fa1", n, d, bm, bn, itemsize=B)
    tc = -(-n // bn)
    assert t.bytes_read("K") == t.bytes_read("V") == n * d * B
    assert t.bytes_read("Q") == t.bytes_read("O") == t.bytes_written("O") == tc * n * d * B
    for stat in ("m", "l"):
        assert t.bytes_read(stat) == t.bytes_written(stat) == tc * n * B


@pytest.mark.parametrize("n, d, bm, bn", [(8, 4, 2, 2), (12, 4, 4, 3)])
def test_fa2_counts(n, d, bm, bn):
    """FlashAttention-2 reads Q once and writes O (and LSE) once; K and V once per Q tile."""
    t = trace("fa2", n, d, bm, bn, itemsize=B)
    tr = -(-n // bm)
    assert t.bytes_read("Q") == t.bytes_written("O") == n * d * B
    assert t.bytes_written("LSE") == n * B
    assert t.bytes_read("K") == t.bytes_read("V") == tr * n * d * B
    assert t.bytes_read("O") == 0


@pytest.mark.parametrize("algo", ["fa1", "fa2"])
def test_causal_skips_exactly_the_future_tiles(algo):
    n, d, block = 12, 4, 3
    t = trace(algo, n, d, block, block, causal=True, itemsize=B)
    tiles = n // block
    needed = tiles * (tiles + 1) // 2  # (i, j) with j <= i
    skipped = {s.pair for s in t.steps if s.kind == "skip"}
    assert skipped == {(i, j) for i in range(tiles) for j in range(tiles) if j > i}  # every future tile, once
    assert sum(1 for s in t.steps if s.kind == "skip") == tiles * tiles - needed
    assert {s.pair for s in t.steps if s.kind == "compute"} == {(i, j) for i in range(tiles) for j in range(i + 1)}
    if algo == "fa2":
        assert t.bytes_read("K") == t.bytes_read("V") == needed * block * d * B
    else:
        assert t.bytes_read("Q") == needed * block * d * B and t.bytes_read("K") == n * d * B


def test_naive_and_softmax_counts():
    n, d = 8, 4
    naive = trace("naive", n, d, 2, 2, itemsize=B)
    for name in ("S", "P"):
        assert naive.bytes_written(name) == naive.bytes_read(name) == n * n * B
    assert naive.bytes_written("O") == n * d * B
    online = trace("softmax", n, d, 2, 4, itemsize=B)
    assert online.bytes_read("x") == 2 * n * n * B and online.bytes_written("y") == n * n * B


def test_decode_counts():
    n, d, bn = 16, 4, 2
    t = trace("decode", n, d, 1, bn, itemsize=B)
    splits = (n // bn) // 2
    assert t.bytes_read("K") == t.bytes_read("V") == n * d * B
    assert t.bytes_written("O_part") == t.bytes_read("O_part") == splits * d * B
    assert t.bytes_written("O") == d * B


def test_counters_sum_the_steps():
    t = trace("fa2", 8, 4, 2, 2, causal=True)
    counters = t.counters()
    assert sum(c["read"] for c in counters.values()) == t.bytes_read()
    assert t.to_json()["counters"] == counters


def test_bad_arguments():
    with pytest.raises(ValueError, match="algo"):
        trace("fa3")
    with pytest.raises(ValueError, match="block_m"):
        trace("fa2", block_m=0)
