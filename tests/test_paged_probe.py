"""scripts/decode_paged_probe.py: its pool and block table must hold the same keys as the contiguous cache it is
compared with (a probe over other data would compare nothing)."""
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from scripts.decode_paged_probe import paged  # noqa: E402


@pytest.mark.parametrize("page_size", [16, 64])
def test_paged_probe_pool_reads_back_the_cache(page_size):
    gen = torch.Generator().manual_seed(page_size)
    cache = torch.randn(3, 128, 2, 8, generator=gen)
    pool, table = paged(cache, page_size, torch.Generator())
    assert table.dtype == torch.int32 and table.shape == (3, 128 // page_size)
    assert sorted(table.flatten().tolist()) == list(range(3 * 128 // page_size))  # every page once
    assert not torch.equal(table.flatten(), torch.arange(table.numel(), dtype=torch.int32))  # shuffled
    assert torch.equal(pool[table.long()].flatten(1, 2), cache)
