"""The lesson kernels: softmax three ways and FlashAttention-1, exact against the reference."""
import pytest
import torch
from helpers import assert_attention_close, randn, torch_attention

from flashtile import reference
from flashtile.lessons.fa1 import flash_attn_v1
from flashtile.lessons.softmax import naive_softmax, online_softmax, safe_softmax


@pytest.mark.parametrize("fn", [naive_softmax, safe_softmax, online_softmax], ids=lambda f: f.__name__)
@pytest.mark.parametrize("shape", [(1, 1), (17, 63), (40, 300)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_softmax_matches_torch(fn, shape):
    x = randn(*shape, dtype=torch.float32, scale=3.0)
    torch.testing.assert_close(fn(x), torch.softmax(x.double(), -1).float(), rtol=1e-5, atol=1e-7)


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_naive_softmax_overflows_where_the_others_do_not():
    x = randn(4, 100, dtype=torch.float32) + 100.0  # exp(100) is past float32's range
    assert naive_softmax(x).isnan().any()
    expected = torch.softmax(x.double(), -1).float()
    torch.testing.assert_close(safe_softmax(x), expected)
    torch.testing.assert_close(online_softmax(x), expected)


def test_online_softmax_masked_rows_fp16():
    x = randn(33, 70, dtype=torch.float16, scale=5.0)
    torch.testing.assert_close(online_softmax(x).float(), torch.softmax(x.float(), -1), rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("seqlen, head_dim", [(1, 16), (63, 32), (100, 64)])
def test_fa1_matches_reference(seqlen, head_dim, dtype, causal):
    q, k, v = (randn(2, seqlen, 2, head_dim, dtype=dtype) for _ in range(3))
    out = flash_attn_v1(q, k, v, causal=causal)
    ref, _ = reference.attention(q, k, v, causal=causal)
    assert_attention_close(out, ref, torch_attention(q, k, v, causal))


def test_fa1_bad_head_dim():
    q = randn(1, 8, 1, 40, dtype=torch.float16)
    with pytest.raises(ValueError, match="head dims"):
        flash_attn_v1(q, q, q)


@pytest.mark.gpu
def test_fa1_on_gpu_bf16():
    q, k, v = (randn(2, 2048, 8, 128, dtype=torch.bfloat16) for _ in range(3))
    out = flash_attn_v1(q, k, v, causal=True)
    ref, _ = reference.attention(q, k, v, causal=True)
    assert_attention_close(out, ref, torch_attention(q, k, v, True))
