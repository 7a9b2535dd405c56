"""GPU tier (`pytest -m gpu`): flash decoding at real sizes, bf16, contiguous and paged caches."""
import pytest
import torch

import flashtile
from helpers import DEVICE, assert_attention_close, randn
from test_decode import expected, paged

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("page_size", [0, 16, 256], ids=["contiguous", "page16", "page256"])
@pytest.mark.parametrize("new_tokens", [1, 5], ids=["decode", "spec5"])
def test_decode_real_sizes(page_size, new_tokens):
    """new_tokens queries and keys appended at cache_seqlens, attended causally; final lengths below."""
    batch, capacity, nheads, nheads_k, head_dim = 4, 16384, 32, 8, 128
    lengths = [new_tokens, 3000, capacity, 9999]
    seqlens = torch.tensor([n - new_tokens for n in lengths], dtype=torch.int32, device=DEVICE)
    q = randn(batch, new_tokens, nheads, head_dim, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(batch, capacity, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k_new, v_new = (randn(batch, new_tokens, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k_full, v_full = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        k_full[b, n - new_tokens:n], v_full[b, n - new_tokens:n] = k_new[b], v_new[b]
    kwargs = dict(k=k_new, v=v_new, cache_seqlens=seqlens, causal=True)
    if page_size:
        k_pages, table = paged(k_cache, page_size)
        v_pages = torch.empty_like(k_pages)
        v_pages[table.flatten().long()] = v_cache.reshape(-1, page_size, nheads_k, head_dim)
        out = flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, block_table=table, **kwargs)
    else:
        out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
    ref, _, base = expected(q, k_full, v_full, lengths, causal=True)
    assert_attention_close(out, ref, base)


def test_decode_long_cache_many_splits():
    q = randn(2, 1, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(2, 131072, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.tensor([131072, 70001], dtype=torch.int32, device=DEVICE)
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    ref, _, base = expected(q, k_cache, v_cache, seqlens.tolist())
    assert_attention_close(out, ref, base)


def test_decode_under_cuda_graph():
    q = randn(1, 1, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(1, 4096, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.tensor([4000], dtype=torch.int32, device=DEVICE)
    flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    q.copy_(randn(1, 1, 32, 128, dtype=torch.bfloat16))
    graph.replay()
    ref, _, base = expected(q, k_cache, v_cache, [4000])
    assert_attention_close(out, ref, base)
