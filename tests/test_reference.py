"""The oracle itself, held to PyTorch's float64 SDPA and to hand-made masks."""
import pytest
import torch
import torch.nn.functional as F

from flashtile import reference


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_reference_matches_torch_sdpa_in_float64(causal):
    q = torch.randn(2, 37, 6, 40, dtype=torch.float64)
    k = torch.randn(2, 53, 3, 40, dtype=torch.float64)
    v = torch.randn(2, 53, 3, 40, dtype=torch.float64)
    out, lse = reference.attention(q, k, v, causal=causal, bottom_right=False)
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=causal, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, 2)) / 40 ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(37, 53, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1).float())


def test_allowed_keys_by_hand():
    # 3 queries, 5 keys: bottom-right puts query i on key i + 2.
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(reference.allowed_keys(3, 5, causal=True), expected)
    top_left = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    assert torch.equal(reference.allowed_keys(3, 5, causal=True, bottom_right=False), top_left)
    window = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(reference.allowed_keys(3, 5, window_size=(1, 1)), window)


def test_empty_rows_give_zero_output_and_minus_inf_lse():
    q, k, v = (torch.randn(1, n, 1, 8, dtype=torch.float64) for n in (4, 2, 2))
    out, lse = reference.attention(q, k, v, causal=True)
    assert torch.equal(out[0, :2], torch.zeros(2, 1, 8, dtype=torch.float64))
    assert (lse[0, 0, :2] == float("-inf")).all() and torch.isfinite(lse[0, 0, 2:]).all()


def test_varlen_is_attention_per_sequence():
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    q, k, v = (torch.randn(10, 2, 8, dtype=torch.float64) for _ in range(3))
    out, lse = reference.attention_varlen(q, k, v, cu, cu, causal=True)
    one, one_lse = reference.attention(q[None, 3:], k[None, 3:], v[None, 3:], causal=True)
    torch.testing.assert_close(out[3:], one[0])
    torch.testing.assert_close(lse[:, 3:], one_lse[0])


def test_reachable_as_an_attribute_of_the_package():
    """`import flashtile` then `flashtile.reference.attention(...)`, as the README writes it, in a fresh process."""
    import subprocess
    import sys
    code = "import flashtile; print(flashtile.reference.attention.__name__, 'reference' in dir(flashtile))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.split() == ["attention", "True"], result.stderr[-2000:]
