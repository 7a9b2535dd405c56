"""kernels/common/tiles.py's host helpers: the window predicates the launchers and dispatch read, the tile sizes."""
import pytest
import torch

from flashtile import reference
from flashtile.kernels.common.tiles import cdiv, head_dim_pad, is_causal, next_pow2, window_keys, windowed

WINDOWS = [(-1, -1), (-1, 0), (0, 0), (256, 0), (3, 5), (-1, 64), (128, -1), (0, -1), (-1, 1)]


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w[0]}_{w[1]}")
def test_window_predicates_match_the_reference_mask(window):
    """is_causal: the window's mask is causal attention's; windowed: it is neither full nor causal attention's;
    window_keys: the most keys a row sees (bounded on both sides), else 2**31 — each against reference.allowed_keys
    on a square of 700 rows and on Nq != Nk."""
    for seqlen_q, seqlen_k in ((700, 700), (300, 700)):
        mask = reference.allowed_keys(seqlen_q, seqlen_k, window_size=window)
        causal = reference.allowed_keys(seqlen_q, seqlen_k, causal=True)
        full = torch.ones_like(mask)
        assert is_causal(window) == torch.equal(mask, causal), window
        assert windowed(window) == (not torch.equal(mask, causal) and not torch.equal(mask, full)), window
        widest = int(mask.sum(1).max())
        assert window_keys(window) == (widest if min(window) >= 0 else 1 << 31), window


def test_tile_sizes():
    """head_dim_pad: the next power of two, at least 32 (the tiles' columns); cdiv rounds up for any sign of a."""
    assert [head_dim_pad(d) for d in (1, 32, 33, 40, 59, 64, 96, 111, 128, 192, 256)] == [
        32, 32, 64, 64, 64, 64, 128, 128, 128, 256, 256]
    assert [next_pow2(n) for n in (1, 2, 3, 1023, 1024)] == [1, 2, 4, 1024, 1024]
    assert [cdiv(a, 64) for a in (0, 1, 64, 65, -1)] == [0, 1, 1, 2, 0]
