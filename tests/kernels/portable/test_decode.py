"""Flash decoding (kernels/portable/decode.py; on the GPU tier kernels/hopper/decode.py too) over contiguous and
paged KV caches, the in-place append, and combine. CPU tier under the Triton interpreter; GPU tier (`pytest -m gpu`)
at real sizes in bf16."""
import functools

import pytest
import torch
from helpers import (
    DEVICE,
    assert_attention_close,
    guarded,
    guards_intact,
    poisoned_outputs,
    randn,
    torch_attention,
    value_checks,
)

import flashtile
from flashtile import dispatch, reference
from flashtile.bench.decode import paged_cache
from flashtile.kernels.common.tiles import tma_addressable

paged = functools.partial(paged_cache, spare_pages=3)  # the same cache as shuffled pages, and its block table


def expected(q, k_cache, v_cache, lengths, causal=False, window_size=(-1, -1)):
    """Per sequence: the reference and PyTorch's own attention over the first lengths[b] keys."""
    refs, lses, bases = [], [], []
    for b, n in enumerate(lengths):
        args = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n])
        ref, lse = reference.attention(*args, causal=causal, window_size=window_size)
        refs.append(ref)
        lses.append(lse)
        bases.append(torch_attention(*args, causal, window_size) if n else torch.zeros_like(args[0]))
    return torch.cat(refs), torch.cat(lses), torch.cat(bases)


@pytest.mark.parametrize("layout", ["contiguous", "paged16", "paged64"])
@pytest.mark.parametrize("heads", [(32, 8), (8, 1)], ids=["gqa32-8", "mqa8-1"])
def test_decode_one_token(heads, layout):
    nheads, nheads_k = heads
    capacity, lengths = 256, [0, 1, 256, 97]
    q = randn(4, 1, nheads, 64, dtype=torch.float16)
    k_cache, v_cache = (randn(4, capacity, nheads_k, 64, dtype=torch.float16) for _ in range(2))
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    kwargs = {}
    if layout != "contiguous":
        page_size = int(layout[5:])
        k_pages, table = paged(k_cache, page_size)
        v_pages, _ = paged(v_cache, page_size, table=table)
        kwargs = dict(block_table=table)
        caches = (k_pages, v_pages)
    else:
        caches = (k_cache, v_cache)
    with poisoned_outputs():
        out, lse = flashtile.flash_attn_with_kvcache(q, *caches, cache_seqlens=seqlens, return_softmax_lse=True,
                                                     **kwargs)
    ref, ref_lse, base = expected(q, k_cache, v_cache, lengths)
    assert_attention_close(out, ref, base, lse, ref_lse)


@pytest.mark.parametrize("num_splits", [1, 3, 0], ids=["1split", "3splits", "auto"])
@pytest.mark.parametrize("paged_cache", [False, True], ids=["contiguous", "paged32"])
def test_append_new_tokens_causal(paged_cache, num_splits):
    """Four new tokens (speculative decoding): written in place, then attended causally, bottom-right."""
    batch, capacity, nheads, nheads_k, head_dim, new = 3, 192, 8, 2, 64, 4
    lengths = [0, 50, capacity - new]
    q = randn(batch, new, nheads, head_dim, dtype=torch.float16)
    k_new, v_new = (randn(batch, new, nheads_k, head_dim, dtype=torch.float16) for _ in range(2))
    k_cache, v_cache = (randn(batch, capacity, nheads_k, head_dim, dtype=torch.float16) for _ in range(2))
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    k_full, v_full = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        k_full[b, n:n + new], v_full[b, n:n + new] = k_new[b], v_new[b]
    if paged_cache:
        k_pages, table = paged(k_cache, 32)
        v_pages, _ = paged(v_cache, 32, table=table)
        k_before, v_before = k_pages.clone(), v_pages.clone()
        out = flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, cache_seqlens=seqlens,
                                                block_table=table, causal=True, num_splits=num_splits)
        k_after = k_pages[table.long()].reshape(batch, capacity, nheads_k, head_dim)
        v_after = v_pages[table.long()].reshape(batch, capacity, nheads_k, head_dim)
        untouched = torch.ones(k_pages.shape[0], dtype=torch.bool, device=DEVICE)
        untouched[table.flatten().long()] = False
        assert torch.equal(k_pages[untouched], k_before[untouched])
        assert torch.equal(v_pages[untouched], v_before[untouched])
    else:
        out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, causal=True,
                                                num_splits=num_splits)
        k_after, v_after = k_cache, v_cache
    assert torch.equal(k_after, k_full) and torch.equal(v_after, v_full), "the append changed other slots"
    ref, _, base = expected(q, k_full, v_full, [n + new for n in lengths], causal=True)
    assert_attention_close(out, ref, base)


def _rotary_table(seqlen_ro, half):
    """cos/sin of a real rotary table (angles position x frequency), float32."""
    angles = torch.arange(seqlen_ro, device=DEVICE)[:, None] * 10000.0 ** (-torch.arange(half, device=DEVICE) / half)
    return torch.cos(angles).float(), torch.sin(angles).float()


@pytest.mark.parametrize("per_token", [True, False], ids=["per-token", "at-seqlen"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
@pytest.mark.parametrize("dims", [(64, 64), (64, 32), (40, 16)], ids=lambda d: f"d{d[0]}-rot{d[1]}")
def test_rotary_kernel(dims, interleaved, per_token):
    """kernels/portable/new_tokens.py against the float64 reference, within 2x the rounding of that reference to
    fp16."""
    from flashtile.kernels.portable.new_tokens import launch_rotary
    head_dim, rotary_dim = dims
    x = randn(3, 5, 6, head_dim, dtype=torch.float16)
    cos, sin = (t + 0.1 * torch.randn_like(t) for t in _rotary_table(60, rotary_dim // 2))  # not only unit pairs
    seqlens = _i32([0, 9, 55])
    out = launch_rotary(x, cos, sin, seqlens, per_token, interleaved)
    steps = torch.arange(5, device=DEVICE) if per_token else torch.zeros(5, dtype=torch.long, device=DEVICE)
    ref = reference.rotary(x, cos, sin, seqlens[:, None].long() + steps, interleaved)
    err = (out.double() - ref).abs().max().item()
    rounding = (ref.to(torch.float16).double() - ref).abs().max().item()
    assert err <= 2 * rounding + 1e-6, f"max error {err:.3g} against fp16 rounding {rounding:.3g}"
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])


@pytest.mark.parametrize("head_dim", [64, 59], ids=["d64", "d59"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
@pytest.mark.parametrize("paged_cache", [False, True], ids=["contiguous", "paged16"])
def test_append_with_rotary(paged_cache, interleaved, causal, head_dim):
    """New k turned at positions cache_seqlens + t before it is written; q at its own positions (causal) or all
    at cache_seqlens (full), as flash-attn does; then attention over the updated cache. Head dim 59 (not a multiple
    of 8): rows the copy engine cannot address, read by pointers."""
    batch, capacity, nheads, nheads_k, new = 3, 64, 8, 2, 3
    lengths = [0, 21, capacity - new]
    q = randn(batch, new, nheads, head_dim, dtype=torch.float16)
    k_new, v_new = (randn(batch, new, nheads_k, head_dim, dtype=torch.float16) for _ in range(2))
    k_cache, v_cache = (randn(batch, capacity, nheads_k, head_dim, dtype=torch.float16) for _ in range(2))
    cos, sin = _rotary_table(capacity, 16)  # rotary_dim 32 of 64
    seqlens = _i32(lengths)
    steps = torch.arange(new, device=DEVICE)
    positions = seqlens[:, None].long() + steps
    q_rot = reference.rotary(q, cos, sin, positions if causal else positions[:, :1].expand(-1, new), interleaved)
    k_rot = reference.rotary(k_new, cos, sin, positions, interleaved).to(torch.float16)
    k_full, v_full = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        k_full[b, n:n + new], v_full[b, n:n + new] = k_rot[b], v_new[b]
    kwargs = dict(cache_seqlens=seqlens, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved,
                  causal=causal)
    if paged_cache:
        k_pages, table = paged(k_cache, 16)
        v_pages, _ = paged(v_cache, 16, table=table)
        out = flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, block_table=table, **kwargs)
        k_after = k_pages[table.long()].reshape(batch, capacity, nheads_k, head_dim)
    else:
        out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kwargs)
        k_after = k_cache
    rounding = (k_rot.double() - reference.rotary(k_new, cos, sin, positions, interleaved)).abs().max().item()
    assert (k_after.double() - k_full.double()).abs().max().item() <= 2 * rounding + 1e-6
    ref, _, base = expected(q_rot.to(torch.float16), k_full, v_full, [n + new for n in lengths], causal=causal)
    assert_attention_close(out, ref, base)


def many_rows_case(seqlen_q, capacity, head_dim, nheads, nheads_k, rotary_dim=0, local=False, alibi=False, new_kv=True,
                   num_splits=0, dtype=torch.float16, seed=0):
    """flash-attn's test_flash_attn_kvcache shape for shape: batch 2, left padding, causal, new tokens appended at
    random cache_seqlens (turned by a rotary table of rotary_dim), optionally a random window and ALiBi slopes;
    every output row against the float64 reference over the keys [pad, length) of its sequence."""
    gen = torch.Generator().manual_seed(seed)
    batch = 2
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    k_new, v_new = (randn(batch, seqlen_q, nheads_k, head_dim, dtype=dtype) for _ in range(2)) if new_kv else (None,
                                                                                                              None)
    k_cache, v_cache = (randn(batch, capacity, nheads_k, head_dim, dtype=dtype) for _ in range(2))
    new = seqlen_q if new_kv else 0
    lengths = torch.randint(0 if new_kv else 1, capacity - new + 1, (batch,), generator=gen)
    pads = torch.stack([torch.randint(0, max(int(n), 1), (1,), generator=gen)[0] for n in lengths])
    window = tuple(torch.randint(0, capacity, (2,), generator=gen).tolist()) if local else (-1, -1)
    slopes = torch.rand(batch, nheads, generator=gen).to(DEVICE) * 0.3 if alibi else None
    kwargs = dict(cache_seqlens=_i32(lengths.tolist()), cache_leftpad=_i32(pads.tolist()), causal=True,
                  window_size=window, alibi_slopes=slopes, num_splits=num_splits)
    k_full, v_full, q_rot = k_cache.clone(), v_cache.clone(), q
    if new_kv:
        k_rot = k_new
        if rotary_dim:
            cos, sin = _rotary_table(capacity, rotary_dim // 2)
            positions = _i32(lengths.tolist())[:, None].long() + torch.arange(seqlen_q, device=DEVICE)
            q_rot = reference.rotary(q, cos, sin, positions, False).to(dtype)
            k_rot = reference.rotary(k_new, cos, sin, positions, False).to(dtype)
            kwargs.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=False)
        for b, n in enumerate(lengths.tolist()):
            k_full[b, n:n + new], v_full[b, n:n + new] = k_rot[b], v_new[b]
    with poisoned_outputs():
        out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kwargs)
    for b, (n, pad) in enumerate(zip(lengths.tolist(), pads.tolist())):
        args = (q_rot[b:b + 1], k_full[b:b + 1, pad:n + new], v_full[b:b + 1, pad:n + new])
        mods = dict(causal=True, window_size=window, alibi_slopes=None if slopes is None else slopes[b])
        ref, _ = reference.attention(*args, **mods)
        base, _ = reference.attention(*args, upcast=False, **mods)
        assert not out[b].isnan().any()
        err = (out[b:b + 1].double() - ref).abs().max().item()
        assert err <= 2 * (base.double() - ref).abs().max().item() + 1e-3, (b, err)


def test_many_query_rows_a_kv_head():
    """384 query rows a KV head (64 new tokens, MQA 6/1) take several row tiles; flash-attn's case of that shape once
    picked a tile the sm90 compiler could not build (tests/tools/test_compile_sm90.py holds every tile to it)."""
    many_rows_case(64, 256, 64, 6, 1, rotary_dim=64)


@pytest.mark.parametrize("num_splits", [1, 3], ids=["1split", "3splits"])
@pytest.mark.parametrize("page_size", [0, 16, 64], ids=["contiguous", "paged16", "paged64"])
def test_cache_leftpad(page_size, num_splits):
    """Sequence b attends to slots [cache_leftpad[b], cache_seqlens[b]) plus two appended tokens, causally;
    a sequence whose pad covers every slot sees only its new tokens. The pad slots hold NaN: pages of 64 come as
    64-key boxes from a tile edge, so the keys before the pad are loaded and must weigh nothing."""
    batch, capacity, nheads, nheads_k, head_dim, new = 4, 128, 8, 2, 64, 2
    lengths, pads = [40, 90, 7, 50], [0, 33, 7, 49]
    q = randn(batch, new, nheads, head_dim, dtype=torch.float16)
    k_new, v_new = (randn(batch, new, nheads_k, head_dim, dtype=torch.float16) for _ in range(2))
    k_cache, v_cache = (randn(batch, capacity, nheads_k, head_dim, dtype=torch.float16) for _ in range(2))
    for b, pad in enumerate(pads):
        k_cache[b, :pad], v_cache[b, :pad] = float("nan"), float("nan")
    k_full, v_full = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        k_full[b, n:n + new], v_full[b, n:n + new] = k_new[b], v_new[b]
    kwargs = dict(cache_seqlens=_i32(lengths), cache_leftpad=_i32(pads), causal=True, num_splits=num_splits,
                  return_softmax_lse=True)
    with poisoned_outputs():
        if page_size:
            k_pages, table = paged(k_cache, page_size)
            v_pages, _ = paged(v_cache, page_size, table=table)
            out, lse = flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, block_table=table,
                                                         **kwargs)
        else:
            out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kwargs)
    for b, (n, pad) in enumerate(zip(lengths, pads)):
        ref, ref_lse, base = expected(q[b:b + 1], k_full[b:b + 1, pad:], v_full[b:b + 1, pad:], [n + new - pad],
                                      causal=True)
        assert_attention_close(out[b:b + 1], ref, base, lse[b:b + 1], ref_lse)


@pytest.mark.parametrize("num_splits", [1, 4], ids=["1split", "4splits"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_softcap(causal, num_splits):
    """Scores capped at ±softcap by tanh (flash-attn's softcap, as Gemma 2 uses it), against the float64
    reference with the same cap, within 2x of that reference run in fp16."""
    softcap, lengths = 2.0, [1, 70, 200]
    q = randn(3, 2, 8, 64, dtype=torch.float16) * 3  # scores well past the cap
    k_cache, v_cache = (randn(3, 200, 2, 64, dtype=torch.float16) for _ in range(2))
    with poisoned_outputs():
        out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=_i32(lengths), causal=causal,
                                                     softcap=softcap, num_splits=num_splits, return_softmax_lse=True)
    for b, n in enumerate(lengths):
        args = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n])
        ref, ref_lse = reference.attention(*args, causal=causal, softcap=softcap)
        base, _ = reference.attention(*args, causal=causal, softcap=softcap, upcast=False)
        assert_attention_close(out[b:b + 1], ref, base, lse[b:b + 1], ref_lse)
    plain = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=_i32(lengths), causal=causal)
    assert (plain - out).abs().max() > 0.1, "the cap changed nothing: the test would not see it missing"


@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes-h", "slopes-bh"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_alibi(causal, per_batch):
    """ALiBi biases −slope · |i + seqlen_k − seqlen_q − j| per query head (GQA 8/2, four new tokens, three
    splits, with a softcap on top in one sequence's call), against the float64 reference."""
    lengths = [5, 70, 150]
    q = randn(3, 4, 8, 64, dtype=torch.float16)
    k_cache, v_cache = (randn(3, 150, 2, 64, dtype=torch.float16) for _ in range(2))
    slopes = 2.0 ** -torch.arange(1, 9, device=DEVICE, dtype=torch.float32)  # the ALiBi paper's, 8 heads
    if per_batch:
        slopes = slopes * torch.tensor([[1.0], [0.5], [4.0]], device=DEVICE)
    for softcap in (0.0, 5.0):
        with poisoned_outputs():
            out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=_i32(lengths),
                                                         causal=causal, alibi_slopes=slopes, softcap=softcap,
                                                         num_splits=3, return_softmax_lse=True)
        for b, n in enumerate(lengths):
            args = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n])
            kwargs = dict(causal=causal, softcap=softcap, alibi_slopes=slopes[b] if per_batch else slopes)
            ref, ref_lse = reference.attention(*args, **kwargs)
            base, _ = reference.attention(*args, upcast=False, **kwargs)
            assert_attention_close(out[b:b + 1], ref, base, lse[b:b + 1], ref_lse)


def _decode_case(monkeypatch, config, heads, capacity, lengths, new, layout):
    """The decode config forced to ``config``; q (batch, new, nheads, head_dim) and caches of batch + 1 rows
    (head-major views for layout "head-major"), each V slot past its sequence's length inf, and the cache row of
    each sequence (shuffled for layout "batch-idx")."""
    monkeypatch.setattr(dispatch, "decode_config", lambda *args, **kwargs: config)
    (nheads, nheads_k, head_dim), batch = heads, len(lengths)
    q = randn(batch, new, nheads, head_dim, dtype=torch.float16)
    k_cache, v_cache = (randn(batch + 1, capacity, nheads_k, head_dim, dtype=torch.float16) for _ in range(2))
    if layout == "head-major":
        k_cache, v_cache = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k_cache, v_cache))
    rows = _i32([5, 0, 2, 1, 3]) if layout == "batch-idx" else _i32(list(range(batch)))
    for row, n in zip(rows.tolist(), lengths):
        v_cache[row, n:] = float("inf")
    return q, k_cache, v_cache, rows


def _pages(k_cache, v_cache, page_size):
    """k_cache, v_cache as shuffled pages of one block table; V's spare pages hold inf."""
    k_pages, table = paged(k_cache, page_size)
    return k_pages, paged(v_cache, page_size, table=table, fill=float("inf"))[0], table


@pytest.mark.parametrize("num_splits", [1, 3], ids=["1split", "3splits"])
@pytest.mark.parametrize("layout", ["contiguous", "batch-idx", "paged16", "paged64"])
@pytest.mark.parametrize("masks", ["none", "causal-window"])
@pytest.mark.parametrize("tiles", [(32, 1), (64, 4)], ids=["32keys", "64keys-4groups"])
def test_decode_whole_and_last_tiles(tiles, masks, layout, num_splits, monkeypatch):
    """The key loop runs whole tiles unmasked and then the tile that crosses the end masked, its V rows zeroed:
    lengths that end inside a tile, on a tile's edge, 0 and the full cache (its slots past each length hold
    inf, which must not reach the output), GQA 8/2, one token or two causal with a window, through a contiguous
    cache, rows picked by cache_batch_idx, or pages (of 16 keys read by pointers; of 64, a tile's keys one TMA box
    inside a page); tiles of one key group, or of four merged at the end."""
    from flashtile import configs
    batch, capacity = 5, 192
    lengths = [0, 1, capacity, 97, 64]
    q, k_cache, v_cache, rows = _decode_case(monkeypatch, configs.DecodeConfig(block_n=tiles[0], num_warps=4,
                                                                               num_stages=1, key_groups=tiles[1]),
                                             (8, 2, 64), capacity, lengths, 2 if masks == "causal-window" else 1,
                                             layout)
    kwargs = dict(cache_seqlens=_i32(lengths), num_splits=num_splits, return_softmax_lse=True)
    if masks == "causal-window":
        kwargs.update(causal=True, window_size=(70, 0))
    if layout.startswith("paged"):
        k_pages, v_pages, kwargs["block_table"] = _pages(k_cache[:batch], v_cache[:batch], int(layout[5:]))
        caches = (k_pages, v_pages)
    elif layout == "batch-idx":
        caches, kwargs["cache_batch_idx"] = (k_cache, v_cache), rows
    else:
        caches = (k_cache[:batch], v_cache[:batch])
    with poisoned_outputs():
        out, lse = flashtile.flash_attn_with_kvcache(q, *caches, **kwargs)
    ref, ref_lse, base = expected(q, k_cache[rows.long()], v_cache[rows.long()], lengths,
                                  causal=masks == "causal-window", window_size=kwargs.get("window_size", (-1, -1)))
    assert_attention_close(out, ref, base, lse, ref_lse)


@pytest.mark.parametrize("num_splits", [1, 3], ids=["1split", "3splits"])
@pytest.mark.parametrize("layout", ["key-major", "head-major", "batch-idx", "paged16"])
@pytest.mark.parametrize("options", ["none", "causal-window", "softcap-alibi"])
@pytest.mark.parametrize("heads", [2, 4], ids=["2heads", "4heads"])
def test_decode_several_kv_heads_a_program(heads, options, layout, num_splits, monkeypatch):
    """A program reads ``heads`` adjacent KV heads a tile, each head's query rows with their own softmax state
    (dispatch.decode_heads_config): every head's output and LSE against the float64 reference, GQA 16/4, lengths
    0, 1, on a tile's edge, inside a tile and full (the slots past each length hold inf), one token or two causal
    with a window, a softcap with per-head ALiBi slopes; the cache key-major (flash-attn's), a head-major view,
    rows picked by cache_batch_idx, or pages of 16 keys (one TMA box of all the heads' keys a page)."""
    from flashtile import configs
    batch, capacity, nheads = 5, 80, 16
    lengths = [0, 1, capacity, 37, 48]
    q, k_cache, v_cache, rows = _decode_case(monkeypatch, configs.DecodeConfig(block_n=16, num_warps=4, num_stages=1,
                                                                               heads=heads), (nheads, 4, 64),
                                             capacity, lengths, 2 if options == "causal-window" else 1, layout)
    kwargs = dict(cache_seqlens=_i32(lengths), num_splits=num_splits, return_softmax_lse=True)
    ref_kwargs = {}
    if options == "causal-window":
        kwargs.update(causal=True, window_size=(30, 0))
        ref_kwargs = dict(causal=True, window_size=(30, 0))
    elif options == "softcap-alibi":
        slopes = 2.0 ** -torch.arange(1, nheads + 1, device=DEVICE, dtype=torch.float32)
        kwargs.update(softcap=3.0, alibi_slopes=slopes)
        ref_kwargs = dict(softcap=3.0, alibi_slopes=slopes)
    if layout == "batch-idx":
        caches, kwargs["cache_batch_idx"] = (k_cache, v_cache), rows
    elif layout == "paged16":
        k_pages, v_pages, kwargs["block_table"] = _pages(k_cache[:batch], v_cache[:batch], 16)
        caches = (k_pages, v_pages)
    else:
        caches = (k_cache[:batch], v_cache[:batch])
    with poisoned_outputs():
        out, lse = flashtile.flash_attn_with_kvcache(q, *caches, **kwargs)
    for b, n in enumerate(lengths):
        if n == 0:  # nothing to attend to: zeros, LSE -inf
            assert torch.equal(out[b], torch.zeros_like(out[b])) and bool((lse[b] == float("-inf")).all())
            continue
        args = (q[b:b + 1], k_cache[rows[b]:rows[b] + 1, :n], v_cache[rows[b]:rows[b] + 1, :n])
        ref, ref_lse = reference.attention(*args, **ref_kwargs)
        base, _ = reference.attention(*args, upcast=False, **ref_kwargs)
        assert_attention_close(out[b:b + 1], ref, base, lse[b:b + 1], ref_lse)


def test_several_heads_config_refuses_what_it_cannot_read():
    """Several KV heads a program need a TMA-addressable cache (pages that hold whole tiles), heads they divide and
    one query-row tile a head: a clear ValueError before any launch otherwise."""
    from flashtile import configs, ops
    q = randn(2, 1, 8, 64, dtype=torch.float16)
    k_cache, v_cache = (randn(2, 64, 2, 64, dtype=torch.float16) for _ in range(2))
    lens = _i32([10, 64])
    for config, call in [
        (configs.DecodeConfig(block_n=16, num_warps=4, num_stages=1, heads=4), (q, k_cache, v_cache)),  # 4 heads of 2
        (configs.DecodeConfig(block_n=16, num_warps=4, num_stages=1, key_groups=2, heads=2), (q, k_cache, v_cache)),
        (configs.DecodeConfig(block_n=16, num_warps=4, num_stages=1, heads=2), (randn(2, 5, 8, 64,
                                                                                      dtype=torch.float16), k_cache,
                                                            v_cache)),  # 4 x 5 = 20 query rows a head
    ]:
        with pytest.raises(ValueError, match="several KV heads a program"):
            ops.kvcache_forward(*call, lens, None, None, 64, 0.125, (-1, -1), 1, config=config)
    k_pages, table = paged(k_cache, 16)  # 32-key tiles cross pages of 16: read by pointers
    with pytest.raises(ValueError, match="several KV heads a program"):
        ops.kvcache_forward(q, k_pages, k_pages, lens, None, table, 64, 0.125, (-1, -1), 1,
                            config=configs.DecodeConfig(block_n=32, num_warps=4, num_stages=1, heads=2))


def test_paged_dispatch():
    """Which tiles a paged cache gets (D=128, 8 KV heads, 4 query rows a head, 132 SMs): four KV heads a box where
    their programs fill the SMs with 4k keys each (pages under 64 keys) or 16k; else one head's boxes of 128 or 64
    keys inside a page; pointers where a tile cannot lie inside a page or TMA cannot address the pool."""
    from flashtile import configs
    rule = functools.partial(dispatch.decode_paged_config, 128)
    b32_4k, b8_32k, b32_32k, b1_32k = (32 * 8, 4096, 132), (8 * 8, 32768, 132), (32 * 8, 32768, 132), (8, 32768, 132)
    assert rule(16, 8, 4, True, True, *b32_32k) == configs.DecodeConfig(block_n=16, num_warps=4, num_stages=8, heads=4,
                                                                        max_rows=16)
    assert rule(32, 8, 4, True, True, *b8_32k) == configs.DecodeConfig(block_n=32, num_warps=4, num_stages=5, heads=4,
                                                                       max_rows=16)
    assert rule(16, 8, 4, True, True, *b1_32k) == configs.DecodeConfig(block_n=128, num_warps=4,
                                                                       num_stages=5)  # 32 programs: pointers
    assert rule(16, 8, 4, True, True, *b32_4k) == configs.DecodeConfig(block_n=64, num_warps=4,
                                                                       num_stages=5)  # 2k keys a program: pointers
    assert rule(256, 8, 4, True, True, *b32_32k).heads == 4  # 16k keys a program
    assert rule(256, 8, 4, True, True, *b8_32k) == configs.DecodeConfig(block_n=128, num_warps=4,
                                                                        num_stages=5)  # 4k keys a program
    assert rule(256, 8, 4, True, True, *b32_4k) == configs.DecodeConfig(block_n=128, num_warps=4,
                                                                        num_stages=3)  # one wave
    assert rule(64, 8, 4, True, True, *b8_32k) == configs.DecodeConfig(block_n=64, num_warps=4, num_stages=7,
                                                                       max_rows=32)
    assert rule(16, 8, 4, True, False, *b32_32k) == configs.DecodeConfig(block_n=64, num_warps=4,
                                                                         num_stages=5)  # heads apart: pointers
    assert rule(16, 6, 4, True, True, *b8_32k) == configs.DecodeConfig(block_n=128, num_warps=4,
                                                                       num_stages=5)  # 6 KV heads: pointers
    assert rule(16, 8, 20, True, True, *b8_32k) == configs.DecodeConfig(block_n=128, num_warps=4,
                                                                        num_stages=5)  # 20 query rows a head
    assert rule(256, 8, 4, False, False, *b8_32k) == configs.DecodeConfig(block_n=128, num_warps=4,
                                                                          num_stages=5)  # not TMA-addressable: pointers
    assert rule(48, 8, 4, True, True, *b8_32k).block_n == 16
    assert dispatch.decode_paged_config(64, 256, 8, 4, True, True, *b32_32k) is None  # D=64: the contiguous tiles
    from flashtile.kernels.portable.decode import reads_by_tma
    pool = randn(6, 16, 8, 64, dtype=torch.float16)
    assert reads_by_tma(pool, pool) and not reads_by_tma(pool, pool[..., ::2])


def test_several_heads_dispatch():
    """Which decode steps read several KV heads a program (D=128, 132 SMs): long caches whose programs still fill
    the SMs, flash-attn's layout only."""
    rule = dispatch.decode_heads_config
    assert rule(128, 8, 4, 32 * 8, 32768, 132).heads == 4  # B=32, L=32k: 64 programs x 2 splits of 16k keys
    assert rule(128, 8, 4, 8 * 8, 131072, 132).heads == 4  # B=8, L=128k: 16 x 8 of 16k
    assert rule(128, 8, 4, 8 * 8, 32768, 132) is None  # B=8, L=32k: 4k keys a program
    assert rule(128, 8, 4, 1 * 8, 131072, 132) is None  # B=1: 2 programs x 16 splits, a quarter of the SMs
    assert rule(128, 8, 4, 32 * 8, 4096, 132) is None
    assert rule(128, 8, 4, 64 * 8, 32768, 132).heads == 4  # B=64: 128 programs, one wave
    assert rule(128, 8, 4, 80 * 8, 32768, 132) is None  # B=80: 160 programs, the second wave 28
    assert rule(128, 8, 4, 66 * 8, 32768, 132).heads == 4  # B=66: 132 programs
    assert rule(128, 8, 32, 32 * 8, 32768, 132) is None  # 8 new tokens: 32 query rows a head
    assert rule(128, 2, 4, 32 * 2, 131072, 132) is None  # 2 KV heads
    assert rule(64, 8, 4, 32 * 8, 32768, 132) is None  # not measured at D=64
    key_major = randn(2, 64, 8, 64, dtype=torch.float16)
    assert dispatch.heads_adjacent(key_major, key_major)
    head_major = key_major.transpose(1, 2).contiguous().transpose(1, 2)
    assert not dispatch.heads_adjacent(key_major, head_major)


def test_waves_dispatch():
    """Two programs an SM (DECODE_SM90_WAVES) once the (batch, KV head) programs fill the SMs, except where that would
    end on a tail wave of under one program an SM after full waves (132 SMs)."""
    from flashtile import configs
    waves = [b for b in (8, 16, 17, 24, 32, 33, 34, 40, 48, 50, 64, 66, 80) if dispatch.decode_waves(b * 8, 132)]
    assert waves == [17, 24, 32, 33, 50, 64, 66]
    assert dispatch.decode_config(128, False, True, 32768) == configs.DecodeConfig(block_n=128, num_warps=4,
                                                                                   num_stages=2, key_groups=4,
                                                                                   max_rows=64)
    assert dispatch.decode_config(128, False, False, 4096) == configs.DecodeConfig(block_n=128, num_warps=4,
                                                                                   num_stages=3)


def test_warp_specialized_dispatch(monkeypatch):
    """dispatch.decode_hopper_config: the Gluon kernel (D=128) from 4096 keys, where the (batch, KV head) programs fill
    their waves of two an SM to nine tenths (132 SMs, 8 KV heads). dispatch.hopper_decode_config, as if on sm90: only
    one split over a contiguous head-major cache with no option that masks or biases scores, at most 16 query rows a
    KV head."""
    from flashtile import configs
    one_an_sm = configs.DecodeHopperConfig(block_n=64, num_stages=3, consumer_regs=200, maxnreg=168)
    assert configs.DECODE_HOPPER[128].per_sm(128) == 2 and one_an_sm.per_sm(128) == 1
    batches = [b for b in (8, 16, 17, 24, 32, 33, 40, 48, 50, 64, 66, 80)
               if dispatch.decode_hopper_config(128, b * 8, 4096, 132)]
    assert batches == [32, 33, 64, 66]
    assert dispatch.decode_hopper_config(128, 256, 2048, 132) is None  # short caches: the portable kernel
    assert dispatch.decode_hopper_config(128, 256, 32768, 132) == configs.DECODE_HOPPER_LONG[128]
    assert configs.DECODE_HOPPER_LONG[128].per_sm(128) == 2
    assert dispatch.decode_hopper_config(64, 256, 4096, 132) is None
    monkeypatch.setattr(configs, "DECODE_BACKEND", "portable")
    assert dispatch.decode_hopper_config(128, 256, 4096, 132) is None
    monkeypatch.setattr(configs, "DECODE_BACKEND", "auto")

    monkeypatch.setattr(dispatch, "arch", lambda device: (9, 0))
    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)

    def head_major(batch=32, seqlen=4096, head_dim=128, dtype=torch.bfloat16):
        return torch.empty(batch, 8, seqlen, head_dim, dtype=dtype).transpose(1, 2)
    q, cache = torch.empty(32, 1, 32, 128, dtype=torch.bfloat16), head_major()
    plain = dict(batch_idx=None, block_table=None, leftpad=None, softcap=0.0, alibi_slopes=None, window_size=(-1, -1))

    def config(q=q, cache=cache, programs=256, **options):
        return dispatch.hopper_decode_config(q, cache, cache, **{**plain, **options},
                                             adjacent=dispatch.heads_adjacent(cache, cache), programs=programs,
                                             capacity=cache.shape[1], sms=132)
    assert config() == configs.DECODE_HOPPER[128]
    assert config(window_size=(-1, 0)) == configs.DECODE_HOPPER[128]  # causal over one new token masks nothing
    assert config(cache=torch.empty(32, 4096, 8, 128, dtype=torch.bfloat16)) is None  # key-major: the portable kernel
    index = torch.zeros(32, dtype=torch.int32)
    for options in (dict(block_table=torch.zeros(32, 4, dtype=torch.int32)), dict(batch_idx=index),
                    dict(leftpad=index), dict(softcap=30.0), dict(alibi_slopes=torch.ones(32)),
                    dict(window_size=(100, 0)), dict(programs=192)):
        assert config(**options) is None, options
    assert config(q=torch.empty(32, 2, 32, 128, dtype=torch.bfloat16), window_size=(-1, 0)) is None
    assert config(q=torch.empty(32, 5, 32, 128, dtype=torch.bfloat16)) is None  # 20 query rows a KV head
    assert config(q=q.float(), cache=head_major(dtype=torch.float32)) is None
    assert config(q=q[..., :64].contiguous(), cache=head_major(head_dim=64)) is None


def test_split_merge_leaves_its_counters_zeroed():
    """The last split of a row tile to finish merges the partials, then zeroes its arrival counter: a second
    call on new data is right too, and no counter is left counting."""
    from flashtile import ops
    for _ in range(2):
        q = randn(3, 2, 8, 64, dtype=torch.float16)
        k_cache, v_cache = (randn(3, 300, 2, 64, dtype=torch.float16) for _ in range(2))
        lengths = [300, 5, 130]
        with poisoned_outputs():
            out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor(
                lengths, dtype=torch.int32, device=DEVICE), causal=True, num_splits=4, return_softmax_lse=True)
        ref, ref_lse, base = expected(q, k_cache, v_cache, lengths, causal=True)
        assert_attention_close(out, ref, base, lse, ref_lse)
    assert ops._SCRATCH and all(int(counters.abs().sum()) == 0 for counters, _ in ops._SCRATCH.values())


def test_scratch_is_reused_and_grows():
    """The split partials and arrival counters live in one scratch pair per device and stream: reused while it
    is big enough, replaced by a bigger (zeroed counters) one when not, the outgrown pair kept alive (a captured
    CUDA graph may still point at it)."""
    from flashtile import ops
    device = torch.device(DEVICE)
    counters, part = ops._scratch(device, 4, 100)
    assert ops._scratch(device, 4, 100)[0] is counters and ops._scratch(device, 4, 100)[1] is part
    bigger, bigger_part = ops._scratch(device, counters.numel() + 1, 100)
    assert bigger.numel() > counters.numel() and int(bigger.abs().sum()) == 0
    assert any(t is counters for t in ops._RETIRED) and any(t is part for t in ops._RETIRED)
    _, wider = ops._scratch(device, 4, bigger_part.numel() + 1)
    assert wider.numel() > bigger_part.numel() and any(t is bigger_part for t in ops._RETIRED)


def test_cache_batch_idx_and_int_seqlens():
    q = randn(2, 1, 4, 64, dtype=torch.float16)
    k_cache, v_cache = (randn(5, 100, 4, 64, dtype=torch.float16) for _ in range(2))
    idx = torch.tensor([3, 1], dtype=torch.int32, device=DEVICE)
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=70, cache_batch_idx=idx)
    ref, _, base = expected(q, k_cache[idx.long()], v_cache[idx.long()], [70, 70])
    assert_attention_close(out, ref, base)


def test_append_through_cache_batch_idx_odd_head_dim():
    """The append writes sequence b's tokens into cache row cache_batch_idx[b] (head dim 40, MQA) and nowhere else."""
    q = randn(2, 2, 4, 40, dtype=torch.float16)
    k_cache, v_cache = (randn(5, 30, 1, 40, dtype=torch.float16) for _ in range(2))
    k_new, v_new = (randn(2, 2, 1, 40, dtype=torch.float16) for _ in range(2))
    idx = _i32([3, 1])
    k_full, v_full = k_cache.clone(), v_cache.clone()
    k_full[idx.long(), 10:12], v_full[idx.long(), 10:12] = k_new, v_new
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=10, cache_batch_idx=idx,
                                            causal=True)
    assert torch.equal(k_cache, k_full) and torch.equal(v_cache, v_full)
    ref, _, base = expected(q, k_full[idx.long()], v_full[idx.long()], [12, 12], causal=True)
    assert_attention_close(out, ref, base)


def test_full_cache_without_seqlens_and_window():
    q = randn(2, 3, 4, 64, dtype=torch.float16)
    k_cache, v_cache = (randn(2, 130, 2, 64, dtype=torch.float16) for _ in range(2))
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, window_size=(20, 0), num_splits=2)
    ref, _, base = expected(q, k_cache, v_cache, [130, 130], window_size=(20, 0))
    assert_attention_close(out, ref, base)


def test_combine_matches_attention_over_all_keys():
    """Attention over three disjoint key shards, merged by combine, equals attention over all keys;
    an empty shard (LSE -inf) contributes nothing."""
    q = randn(2, 9, 4, 64, dtype=torch.float16)
    k, v = (randn(2, 120, 4, 64, dtype=torch.float16) for _ in range(2))
    parts, lses = [], []
    for lo, hi in ((0, 50), (50, 50), (50, 120)):
        if hi == lo:
            parts.append(torch.full_like(q, float("nan")))
            lses.append(torch.full((2, 4, 9), float("-inf"), device=DEVICE))
            continue
        out, lse, _ = flashtile.flash_attn_func(q, k[:, lo:hi], v[:, lo:hi], return_attn_probs=True)
        parts.append(out)
        lses.append(lse)
    merged = flashtile.combine(torch.stack(parts), torch.stack(lses))
    ref, _ = reference.attention(q, k, v)
    assert_attention_close(merged, ref, torch_attention(q, k, v))


def test_combine_all_empty_gives_zero():
    parts = randn(3, 1, 2, 2, 32, dtype=torch.float16)
    lses = torch.full((3, 1, 2, 2), float("-inf"), device=DEVICE)
    assert torch.equal(flashtile.combine(parts, lses), torch.zeros(1, 2, 2, 32, dtype=torch.float16, device=DEVICE))


def _kv(batch=2, capacity=64, nheads_k=2):
    return tuple(randn(batch, capacity, nheads_k, 64, dtype=torch.float16) for _ in range(2))


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


BAD = {
    "seqlens-beyond": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=_i32([3, 65])),
                       ValueError, "within the cache"),
    "append-beyond": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc, vc, kc[:, :2], vc[:, :2], cache_seqlens=63), ValueError, "within the cache"),
    "seqlens-int64": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=_i32([1, 2]).long()), TypeError, "cache_seqlens must be int32"),
    "table-out-of-range": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc.view(8, 16, 2, 64), vc.view(8, 16, 2, 64), cache_seqlens=30, block_table=_i32([[0, 9], [1, 2]])),
        ValueError, "block_table holds page indices"),
    "table-dtype": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc.view(8, 16, 2, 64), vc.view(8, 16, 2, 64), block_table=_i32([[0, 1], [2, 3]]).long()), TypeError,
        "block_table must be int32"),
    "cache-dtype": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(q, kc.float(), vc.float()), TypeError,
                    "k_cache has dtype"),
    "k-without-v": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(q, kc, vc, k=kc[:, :1], cache_seqlens=1),
                    ValueError, "k and v must be given together"),
    "batch-idx-range": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc, vc, cache_batch_idx=_i32([0, 2])), ValueError, "cache_batch_idx holds"),
    "rotary-cos-only": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc, vc, kc[:, :1], vc[:, :1], cache_seqlens=1, rotary_cos=torch.ones(4, 32, device=DEVICE)), ValueError,
        "rotary_cos and rotary_sin must be given together"),
    "rotary-without-k": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc, vc, rotary_cos=torch.ones(4, 32, device=DEVICE), rotary_sin=torch.ones(4, 32, device=DEVICE)),
        ValueError, "pass k and v"),
    "rotary-dim": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc, vc, kc[:, :1], vc[:, :1], cache_seqlens=1, rotary_cos=torch.ones(80, 40, device=DEVICE),
        rotary_sin=torch.ones(80, 40, device=DEVICE)), ValueError, "rotary_dim"),
    "rotary-positions": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc, vc, kc[:, :2], vc[:, :2], cache_seqlens=_i32([3, 30]), rotary_cos=torch.ones(31, 16, device=DEVICE),
        rotary_sin=torch.ones(31, 16, device=DEVICE)), ValueError, "positions up to 31"),
    "cache-strided-last-dim": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc.transpose(-1, -2).contiguous().transpose(-1, -2), vc), ValueError,
        "k_cache must have a contiguous last dimension"),
    "alibi-shape": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc, vc, alibi_slopes=torch.ones(3, device=DEVICE)), ValueError, "alibi_slopes must be"),
    "alibi-dtype": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc, vc, alibi_slopes=torch.ones(4, device=DEVICE, dtype=torch.float16)), TypeError,
        "alibi_slopes must be float32"),
    "softcap-negative": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(q, kc, vc, softcap=-1.0), ValueError,
                         "softcap must be"),
    "leftpad-beyond": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=_i32([5, 9]), cache_leftpad=_i32([0, 10])), ValueError, "cache_leftpad must lie"),
    "leftpad-int64": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=_i32([5, 9]), cache_leftpad=_i32([0, 1]).long()), TypeError,
        "cache_leftpad must be int32"),
    "num-splits": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(q, kc, vc, num_splits=-1), ValueError,
                   "num_splits"),
    "head-major-cache": (lambda q, kc, vc: flashtile.flash_attn_with_kvcache(
        q, kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()), ValueError,
        r"\(batch_cache, seqlen_cache, nheads_k, headdim\), as in flash-attn; a head-major .* k_cache.transpose\(1, 2\)"),  # noqa: E501
    "combine-shape": (lambda q, kc, vc: flashtile.combine(q[None], torch.zeros(1, 2, 3, 1, device=DEVICE)),
                      ValueError, "lse_partials must be"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case):
    fn, error, message = BAD[case]
    with value_checks(), pytest.raises(error, match=message):
        fn(randn(2, 1, 4, 64, dtype=torch.float16), *_kv())


def test_block_table_padding_past_the_used_pages_is_accepted():
    """Only the pages a sequence uses are range-checked: -1 padding after them is fine."""
    q = randn(2, 1, 4, 64, dtype=torch.float16)
    k_cache, v_cache = (randn(2, 64, 2, 64, dtype=torch.float16) for _ in range(2))
    k_pages, table = paged(k_cache, 16)
    v_pages, _ = paged(v_cache, 16, table=table)
    table[:, 2:] = -1  # 20 keys use pages 0 and 1 only
    out = flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=20, block_table=table)
    ref, _, base = expected(q, k_cache, v_cache, [20, 20])
    assert_attention_close(out, ref, base)
    table[1, 1] = -1
    with value_checks(), pytest.raises(ValueError, match="block_table holds page indices"):
        flashtile.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=20, block_table=table)


def test_expanded_cache():
    """A zero-stride (expanded) cache gives the right answer (it is routed to pointer loads: see below)."""
    q = randn(3, 1, 4, 64, dtype=torch.float16)
    k_one, v_one = (randn(1, 50, 2, 64, dtype=torch.float16) for _ in range(2))
    k_cache, v_cache = k_one.expand(3, -1, -1, -1), v_one.expand(3, -1, -1, -1)
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=50)
    ref, _, base = expected(q, k_cache.contiguous(), v_cache.contiguous(), [50, 50, 50])
    assert_attention_close(out, ref, base)


def test_tma_addressable():
    """What may become a TMA descriptor: the interpreter accepts more than a GPU does, so this is checked here."""
    base = randn(2, 64, 4, 64, dtype=torch.float16)
    assert tma_addressable(base) and tma_addressable(base.transpose(1, 2).contiguous().transpose(1, 2))
    assert not tma_addressable(base[:1].expand(3, -1, -1, -1))  # zero stride on a dim of 3
    assert tma_addressable(base[:1].expand(1, -1, -1, -1))  # a dim of 1 may have any stride
    assert not tma_addressable(base[..., 1:33])  # base address 2 bytes past alignment
    assert not tma_addressable(randn(2, 64, 4, 36, dtype=torch.float16))  # 72-byte rows
    assert not tma_addressable(base.transpose(-1, -2))  # last dim not contiguous


@pytest.mark.parametrize("layout", ["contiguous-d59", "paged16"])
def test_index_values_never_leave_their_tensors(layout):
    """With the value checks off (as on the GPU by default), cache_seqlens, cache_leftpad, cache_batch_idx and
    block_table past either end of what they index, and rotary positions past the table, give a wrong answer but no
    read or write outside the cache, the new tokens or the rotary table: each sits between NaN guards, which must stay
    NaN and never reach the output. (Pages of 16 and head dim 59 are read by pointers, not TMA boxes.)"""
    batch, capacity, nheads, nheads_k, new = 3, 64, 4, 2, 2
    head_dim = 59 if layout.endswith("d59") else 64
    paged_cache = layout.startswith("paged")
    shape = (batch * capacity // 16, 16, nheads_k, head_dim) if paged_cache else (batch, capacity, nheads_k, head_dim)
    (k_cache, k_buffer), (v_cache, v_buffer) = guarded(*shape), guarded(*shape)
    (k_new, _), (v_new, _) = guarded(batch, new, nheads_k, head_dim), guarded(batch, new, nheads_k, head_dim)
    (cos, cos_buffer), (sin, _) = guarded(capacity, 16, dtype=torch.float32), guarded(capacity, 16,
                                                                                      dtype=torch.float32)
    q = randn(batch, new, nheads, head_dim, dtype=torch.float16)
    kwargs = dict(cache_seqlens=_i32([capacity + 7, -5, capacity - new]), cache_leftpad=_i32([capacity + 3, -2, 5]),
                  rotary_cos=cos, rotary_sin=sin, causal=True, num_splits=2)
    if paged_cache:
        table = torch.randperm(shape[0], device=DEVICE).to(torch.int32).view(batch, capacity // 16)
        table[0, -1], table[1, 0] = shape[0] + 3, -4
        kwargs["block_table"] = table
    else:
        kwargs["cache_batch_idx"] = _i32([batch, -1, 1])
    flashtile.set_value_checks(False)
    try:
        out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kwargs)
    finally:
        flashtile.set_value_checks(None)
    assert out.isfinite().all()
    assert all(guards_intact(b) for b in (k_buffer, v_buffer, cos_buffer))
    with value_checks(), pytest.raises(ValueError):  # the debug mode refuses the same call
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kwargs)


def test_decode_plans_split_the_cache_into_whole_tiles():
    """dispatch.decode: the portable kernel here (the interpreter's tiles), with ``num_splits`` splits or as many as
    decode_splits gives, each a whole number of tiles and together covering the cache; the sm90 kernel only where
    hopper_decode_config gives a config (never here)."""
    from flashtile import configs
    q, cache = randn(2, 1, 8, 64, dtype=torch.float16), randn(2, 1000, 2, 64, dtype=torch.float16)
    for num_splits in (0, 1, 3, 7):
        plan = dispatch.decode(q, cache, cache, 1000, num_splits)
        assert plan.kernel == "portable/decode.py" and plan.config == configs.DECODE_INTERPRETER
        assert plan.chunk % plan.config.block_n == 0
        assert (plan.splits - 1) * plan.chunk < 1000 <= plan.splits * plan.chunk  # whole, none empty
        if num_splits:
            assert plan.splits <= num_splits
    assert "split" in str(dispatch.decode(q, cache, cache, 1000, 3))


# GPU tier (`pytest -m gpu`): flash decoding at real sizes, bf16, contiguous and paged caches, both decode kernels.
def _kvcache_call(q, k_cache, v_cache, page_size, **kwargs):
    """flash_attn_with_kvcache on the cache as it is (page_size 0) or as shuffled pages of page_size slots."""
    if not page_size:
        return flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
    k_pages, table = paged(k_cache, page_size)
    return flashtile.flash_attn_with_kvcache(q, k_pages, paged(v_cache, page_size, table=table)[0], block_table=table,
                                             **kwargs)


def _arch_sm90():
    return torch.cuda.get_device_capability() == (9, 0)


def _decode_launches(monkeypatch):
    """The configs of every launch of the warp-specialized decode kernel, and of the portable one, from here on."""
    from flashtile import ops
    from flashtile.kernels.hopper import decode as decode_hopper
    seen = {"hopper": [], "portable": []}
    launch, launch_hopper = ops.launch_decode, decode_hopper.launch_decode_hopper
    monkeypatch.setattr(ops, "launch_decode", lambda *a, **kw: (seen["portable"].append(a[12]), launch(*a, **kw)))
    monkeypatch.setattr(decode_hopper, "launch_decode_hopper",
                        lambda *a, **kw: (seen["hopper"].append(a[7]), launch_hopper(*a, **kw)))
    return seen


@pytest.mark.gpu
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
    out = _kvcache_call(q, k_cache, v_cache, page_size, k=k_new, v=v_new, cache_seqlens=seqlens, causal=True)
    ref, _, base = expected(q, k_full, v_full, lengths, causal=True)
    assert_attention_close(out, ref, base)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [32, 4], ids=["waves", "splits"])
@pytest.mark.parametrize("page_size", [16, 32, 64, 128, 256], ids=lambda p: f"page{p}")
def test_decode_paged_tiles(page_size, batch, monkeypatch):
    """Each page size's tiles (dispatch.decode_paged_config: pages under 64 keys as boxes of four KV heads or by
    pointers, longer ones as one head's boxes of 64 or 128 keys, each inside a page), at ragged lengths with inf in
    every slot past a sequence's end; two new tokens, causal, a window of 3000 keys."""
    configs_seen = _decode_launches(monkeypatch)["portable"]
    capacity = 8192
    lengths = ([2, 3, capacity, 4095, 4096, 4097] + torch.randint(2, capacity, (max(batch - 6, 0),)).tolist())[:batch]
    q = randn(batch, 2, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(batch, capacity, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    for b, n in enumerate(lengths):
        k_cache[b, n:], v_cache[b, n:] = float("inf"), float("inf")
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE) - 2
    slots = (torch.arange(batch, device=DEVICE)[:, None], seqlens.long()[:, None] + torch.arange(2, device=DEVICE))
    k_new, v_new = k_cache[slots], v_cache[slots]  # the cache's own last two keys, appended again
    out = _kvcache_call(q, k_cache, v_cache, page_size, k=k_new, v=v_new, cache_seqlens=seqlens,
                        causal=True, window_size=(3000, 0))
    chosen = configs_seen[-1]
    if page_size < 64:  # four heads a box with 4k keys a program (B=32), else pointers over 128-key tiles (B=4)
        assert (chosen.heads, chosen.block_n) == ((4, page_size) if batch == 32 else (1, 128)), chosen
    else:
        assert (chosen.heads, chosen.block_n) == (1, min(page_size, 128)), chosen
    ref, _, base = expected(q, k_cache, v_cache, lengths, causal=True, window_size=(3000, 0))
    assert_attention_close(out, ref, base)


@pytest.mark.gpu
def test_decode_long_cache_many_splits():
    q = randn(2, 1, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(2, 131072, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.tensor([131072, 70001], dtype=torch.int32, device=DEVICE)
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    ref, _, base = expected(q, k_cache, v_cache, seqlens.tolist())
    assert_attention_close(out, ref, base)


@pytest.mark.gpu
@pytest.mark.parametrize("new_tokens", [1, 2], ids=["decode", "spec2"])
@pytest.mark.parametrize("layout", ["key-major", "head-major"])
def test_decode_by_cache_layout(layout, new_tokens, monkeypatch):
    """B=32, L=32k: one new token over SDPA's head-major cache takes the warp-specialized kernel
    (kernels/hopper/decode.py)
    on sm90; two new tokens, causal, the portable one, which reads that layout one head a program, as it reads
    flash-attn's key-major cache four KV heads a program (dispatch.decode_heads_config), whatever the new tokens; all
    right at ragged lengths (0, 1, around the split edge, full)."""
    seen = _decode_launches(monkeypatch)
    configs_seen, hopper_seen = seen["portable"], seen["hopper"]
    batch, capacity = 32, 32768
    lengths = [0, 1, capacity, 16383, 16384, 16385] + torch.randint(1, capacity, (batch - 6,)).tolist()
    q = randn(batch, new_tokens, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(batch, capacity, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    if layout == "head-major":
        k_cache, v_cache = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k_cache, v_cache))
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True)
    if new_tokens == 1 and layout == "head-major" and _arch_sm90():
        assert hopper_seen and not configs_seen, (hopper_seen, configs_seen)
    else:
        assert configs_seen[-1].heads == (4 if layout == "key-major" else 1) and not hopper_seen, configs_seen
    ref, _, base = expected(q, k_cache, v_cache, lengths, causal=True)
    assert_attention_close(out, ref, base)


@pytest.mark.gpu
@pytest.mark.parametrize("append", [False, True], ids=["cached", "append1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["key-major", "head-major"])
@pytest.mark.parametrize("heads", [(32, 8), (16, 2)], ids=["gqa32-8", "gqa16-2"])
def test_decode_warp_specialized(heads, layout, dtype, append, monkeypatch):
    """One split whose (batch, KV head) programs fill their waves (dispatch.decode_hopper_config): B=32 with 8 KV heads
    over 16k keys, B=128 with 2 (eight query heads each) over 4k, each of the two ring depths.
    kernels/hopper/decode.py on sm90 over a head-major cache (the portable kernel over a key-major
    one), right in O and LSE at ragged lengths (0, 1,
    around the 64-key tiles, full) with NaN in every cache slot past a sequence, with or without a new token appended
    first; the output filled with NaN beforehand shows any row it leaves unwritten."""
    from flashtile.kernels.common.tiles import num_sms
    nheads, nheads_k = heads
    batch, capacity = (32, 16384) if nheads_k == 8 else (128, 4096)  # the configs from 16k keys and under
    seen = _decode_launches(monkeypatch)
    lengths = [0, 1, capacity, 63, 64, 65, 127] + torch.randint(1, capacity, (batch - 7,)).tolist()
    new = int(append)
    lengths = [max(n, new) for n in lengths]
    q = randn(batch, 1, nheads, 128, dtype=dtype)
    k_cache, v_cache = (randn(batch, capacity, nheads_k, 128, dtype=dtype) for _ in range(2))
    if layout == "head-major":
        k_cache, v_cache = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k_cache, v_cache))
    k_full, v_full = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        k_cache[b, n - new:], v_cache[b, n - new:] = float("nan"), float("nan")
    kwargs = dict(cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=DEVICE) - new)
    if append:
        slots = (torch.arange(batch, device=DEVICE)[:, None], kwargs["cache_seqlens"].long()[:, None])
        kwargs.update(k=k_full[slots], v=v_full[slots])
    with poisoned_outputs():
        out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=True, **kwargs)
    hopper = dispatch.decode_hopper_config(128, batch * nheads_k, capacity, num_sms(q.device))
    if _arch_sm90() and hopper and not dispatch.heads_adjacent(k_cache, v_cache):
        assert seen["hopper"] == [hopper] and not seen["portable"], seen
    else:  # flash-attn's key-major cache: the portable kernel
        assert seen["portable"] and not seen["hopper"], seen
    ref, ref_lse, base = expected(q, k_full, v_full, lengths)
    assert_attention_close(out, ref, base, lse, ref_lse)


@pytest.mark.gpu
def test_decode_warp_specialized_under_cuda_graph(monkeypatch):
    """The warp-specialized kernel (a head-major cache) captured in a CUDA graph reads the q and lengths of each
    replay."""
    seen = _decode_launches(monkeypatch)
    q = randn(32, 1, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(32, 8, 4096, 128, dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    seqlens = torch.randint(1, 4097, (32,), dtype=torch.int32, device=DEVICE)
    flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    q.copy_(randn(32, 1, 32, 128, dtype=torch.bfloat16))
    seqlens.copy_(torch.randint(1, 4097, (32,), dtype=torch.int32, device=DEVICE))
    graph.replay()
    assert seen["hopper"] or not _arch_sm90(), seen
    ref, _, base = expected(q, k_cache, v_cache, seqlens.tolist())
    assert_attention_close(out, ref, base)


@pytest.mark.gpu
def test_decode_in_three_waves(monkeypatch):
    """B=40: 320 (batch, KV head) programs, which at two an SM would end on a tail of 56 after one full wave, run one an
    SM (dispatch.decode_waves; 3 stages on a 132-SM H200), right at ragged lengths."""
    from flashtile import configs
    from flashtile.kernels.common.tiles import num_sms
    configs_seen = _decode_launches(monkeypatch)["portable"]
    batch, capacity = 40, 4096
    lengths = [0, 1, capacity, 127, 128, 129] + torch.randint(1, capacity, (batch - 6,)).tolist()
    q = randn(batch, 1, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(batch, 8, capacity, 128, dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    if num_sms(q.device) == 132:
        assert configs_seen[-1] == configs.DECODE_SM90[128], configs_seen
    assert configs_seen[-1].num_stages == (2 if dispatch.decode_waves(batch * 8, num_sms(q.device)) else 3)
    ref, _, base = expected(q, k_cache, v_cache, lengths)
    assert_attention_close(out, ref, base)


@pytest.mark.gpu
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


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [0, 16], ids=["contiguous", "page16"])
def test_decode_loop_replays_see_each_steps_tensors(page_size):
    """A decode loop keeps its shapes, so after the first step every launch is a replay (kernels/common/replay.py):
    each step's q, new keys and lengths must be the ones read, and a second cache of the same shape (another
    address, so another launch key) must be read, not the first. The append replays too (its key has no
    address)."""
    from flashtile.kernels.portable import decode, new_tokens
    batch, capacity, nheads, nheads_k, head_dim = 2, 8192, 32, 8, 128
    for cache_round in range(2):
        k_full, v_full = (randn(batch, capacity, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
        lengths = [100, 5000]
        if page_size:
            k_cache, table = paged(k_full, page_size)
            v_cache, _ = paged(v_full, page_size, table=table)
        else:
            k_cache, v_cache, table = k_full.clone(), v_full.clone(), None
        for step in range(4):
            q = randn(batch, 1, nheads, head_dim, dtype=torch.bfloat16)
            k_new, v_new = (randn(batch, 1, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
            seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
            keys_before = set(decode._REPLAYS.replays), set(new_tokens._REPLAYS.replays)
            out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=seqlens,
                                                    block_table=table)
            if step:
                assert (set(decode._REPLAYS.replays), set(new_tokens._REPLAYS.replays)) == keys_before, \
                    "a step with unchanged shapes was not replayed"
            for b, n in enumerate(lengths):
                k_full[b, n], v_full[b, n] = k_new[b, 0], v_new[b, 0]
            lengths = [n + 1 for n in lengths]
            ref, _, base = expected(q, k_full, v_full, lengths)
            assert_attention_close(out, ref, base)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
def test_decode_with_rotary_bf16(interleaved):
    """Rotary on q and the appended k at real sizes in bf16 (the interpreter's bf16 is not trusted)."""
    batch, capacity, nheads, nheads_k, head_dim = 4, 8192, 32, 8, 128
    lengths = [0, 3000, capacity - 1, 777]
    q = randn(batch, 1, nheads, head_dim, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(batch, capacity, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k_new, v_new = (randn(batch, 1, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    cos, sin = _rotary_table(capacity, head_dim // 2)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    positions = seqlens[:, None].long()
    q_rot = reference.rotary(q, cos, sin, positions, interleaved).to(torch.bfloat16)
    k_rot = reference.rotary(k_new, cos, sin, positions, interleaved).to(torch.bfloat16)
    k_full, v_full = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        k_full[b, n], v_full[b, n] = k_rot[b, 0], v_new[b, 0]
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, rotary_cos=cos,
                                            rotary_sin=sin, rotary_interleaved=interleaved)
    step = torch.finfo(torch.bfloat16).eps * k_rot.double().abs().max().item()
    assert (k_cache.double() - k_full.double()).abs().max().item() <= step  # within one bf16 rounding
    ref, _, base = expected(q_rot, k_full, v_full, [n + 1 for n in lengths])
    assert_attention_close(out, ref, base)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [0, 256], ids=["contiguous", "page256"])
def test_decode_with_cache_leftpad_bf16(page_size):
    """Left-padded sequences at real sizes: each attends to slots [cache_leftpad[b], cache_seqlens[b])."""
    batch, capacity, nheads, nheads_k, head_dim = 4, 16384, 32, 8, 128
    lengths, pads = [16384, 3000, 9999, 513], [0, 2999, 4096, 1]
    q = randn(batch, 1, nheads, head_dim, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(batch, capacity, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    out = _kvcache_call(q, k_cache, v_cache, page_size,
                        cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=DEVICE),
                        cache_leftpad=torch.tensor(pads, dtype=torch.int32, device=DEVICE))
    for b, (n, pad) in enumerate(zip(lengths, pads)):
        ref, _, base = expected(q[b:b + 1], k_cache[b:b + 1, pad:], v_cache[b:b + 1, pad:], [n - pad])
        assert_attention_close(out[b:b + 1], ref, base)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [0, 64], ids=["contiguous", "page64"])
def test_decode_softcap_bf16(page_size):
    """softcap at real sizes in bf16, against the float64 reference with the same cap."""
    from flashtile import reference
    q = randn(2, 3, 32, 128, dtype=torch.bfloat16) * 4
    k_cache, v_cache = (randn(2, 8192, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    lengths = [8192, 1234]
    out = _kvcache_call(q, k_cache, v_cache, page_size, causal=True, softcap=30.0,
                        cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=DEVICE))
    for b, n in enumerate(lengths):
        args = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n])
        ref, _ = reference.attention(*args, causal=True, softcap=30.0)
        base, _ = reference.attention(*args, causal=True, softcap=30.0, upcast=False)
        assert_attention_close(out[b:b + 1], ref, base)


@pytest.mark.gpu
def test_decode_alibi_bf16():
    """ALiBi at real sizes in bf16 (32/8 heads, one new token, many splits), against the float64 reference."""
    from flashtile import reference
    q = randn(2, 1, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(2, 32768, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    slopes = 2.0 ** (-8.0 * torch.arange(1, 33, device=DEVICE, dtype=torch.float32) / 32)
    lengths = [32768, 4097]
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, alibi_slopes=slopes,
                                            cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=DEVICE))
    for b, n in enumerate(lengths):
        args = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n])
        ref, _ = reference.attention(*args, alibi_slopes=slopes)
        base, _ = reference.attention(*args, alibi_slopes=slopes, upcast=False)
        assert_attention_close(out[b:b + 1], ref, base)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["q64-k2048-d64-rotary", "q16-k128k-d256-local-alibi"])
def test_flash_attn_kvcache_cases(case):
    """flash-attn 2.8.3's test_flash_attn_kvcache cases that failed before every tile was held to the sm90 compiler:
    64 new tokens at D=64, MQA 6/1, rotary, left padding (PassManager::run failed); 16 queries over a 128k cache at
    D=256 with a window and ALiBi, one split (out of shared memory)."""
    if case.startswith("q64"):
        many_rows_case(64, 2048, 64, 6, 1, rotary_dim=64)
    else:
        many_rows_case(16, 131072, 256, 6, 1, local=True, alibi=True, new_kv=False, num_splits=1)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["head-major", "key-major", "paged256"])
def test_default_decode_reads_no_index_back_and_stays_inside(layout, monkeypatch):
    """The default settings read no index value back to the host (no sync: the call runs under CUDA graph capture
    as it is) and cache_seqlens past the capacity, or pages past the pool, stay inside the cache on every kernel the
    dispatch picks here: the warp-specialized one (head-major, one split), the portable one by TMA boxes (key-major,
    pages of 256). The cache sits between NaN guards that must stay NaN and out of the output."""
    batch, capacity, nheads, nheads_k, head_dim = 32, 4096, 32, 8, 128
    q = randn(batch, 1, nheads, head_dim, dtype=torch.bfloat16)
    if layout == "head-major":
        (k_cache, k_buffer), (v_cache, v_buffer) = (guarded(batch, nheads_k, capacity, head_dim,
                                                             dtype=torch.bfloat16) for _ in range(2))
        k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        kwargs = {}
    elif layout == "key-major":
        (k_cache, k_buffer), (v_cache, v_buffer) = (guarded(batch, capacity, nheads_k, head_dim, dtype=torch.bfloat16)
                                                    for _ in range(2))
        kwargs = {}
    else:
        pages = batch * capacity // 256
        (k_cache, k_buffer), (v_cache, v_buffer) = (guarded(pages, 256, nheads_k, head_dim, dtype=torch.bfloat16)
                                                    for _ in range(2))
        table = torch.randperm(pages, device=DEVICE).to(torch.int32).view(batch, capacity // 256)
        table[-1, -1], table[0, 0] = pages + 5, -7
        kwargs = dict(block_table=table)
    seqlens = _i32([capacity + 100] * (batch - 1) + [-3])
    launches = _decode_launches(monkeypatch)
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, **kwargs)
    torch.cuda.synchronize()
    assert out.isfinite().all() and guards_intact(k_buffer) and guards_intact(v_buffer)
    assert bool(launches["hopper"]) == (layout == "head-major")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a host read would fail the capture
        captured = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, **kwargs)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, out)


@pytest.mark.gpu
def test_default_settings_never_sync_the_host():
    """With the defaults no entry point reads a device tensor back to the host (torch's sync debug mode raises on any
    synchronizing call): flash_attn_func, forward and backward on each sm90 backward design (D=64 one pass, D=128
    causal two kernels, D=256 one warpgroup per gradient), the packed varlen forward and backward, paged varlen,
    flash_attn_with_kvcache on contiguous and paged caches with every index tensor and new tokens, SDPA, combine. The
    first call of each shape compiles and may allocate; the second is the one that must not sync."""
    q, k, v = (randn(2, 300, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 100, 300, 600], dtype=torch.int32, device=DEVICE)
    qp, kp, vp = (t.reshape(600, 4, 128).requires_grad_() for t in (q, k, v))
    k_cache, v_cache = (randn(4, 1024, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    k_pages, table = paged(k_cache, 64)
    v_pages, _ = paged(v_cache, 64, table=table)
    k_new, v_new = (randn(4, 2, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    qd = randn(4, 2, 8, 128, dtype=torch.bfloat16)
    seqlens, pads, rows = _i32([10, 500, 1000, 3]), _i32([0, 7, 100, 1]), _i32([3, 2, 1, 0])
    cos, sin = torch.rand(1024, 32, device=DEVICE), torch.rand(1024, 32, device=DEVICE)
    def step(batch, seqlen, head_dim, causal):
        x, y, z = (randn(batch, seqlen, 2, head_dim, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
        return lambda: flashtile.flash_attn_func(x, y, z, causal=causal).sum().backward()
    calls = [
        lambda: flashtile.flash_attn_func(q, k, v, causal=True),
        step(1, 4096, 64, False), step(1, 2048, 128, True), step(2, 300, 256, False),
        lambda: flashtile.flash_attn_varlen_func(qp, kp, vp, cu, cu, 300, 300, causal=True).sum().backward(),
        lambda: flashtile.flash_attn_varlen_func(qp, k_pages, v_pages, cu, cu, 300, 300, causal=True,
                                                 block_table=table[:3]),
        lambda: flashtile.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
        lambda: flashtile.flash_attn_with_kvcache(qd, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                                 cache_batch_idx=rows, cache_leftpad=pads, rotary_cos=cos,
                                                 rotary_sin=sin, causal=True),
        lambda: flashtile.flash_attn_with_kvcache(qd, k_pages, v_pages, k_new, v_new, cache_seqlens=seqlens,
                                                 block_table=table, cache_leftpad=pads, causal=True),
        lambda: flashtile.combine(torch.stack([q, k]), torch.zeros(2, 2, 4, 300, device=DEVICE)),
    ]
    for call in calls:
        call()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
