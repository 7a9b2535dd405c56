"""GPU tier (`pytest -m gpu`): flash decoding at real sizes, bf16, contiguous and paged caches."""
import pytest
import torch
from helpers import DEVICE, assert_attention_close, poisoned_outputs, randn
from test_decode import _guarded, _guards_intact, _i32, expected, many_rows_case, paged

import flashtile
from flashtile import dispatch

pytestmark = pytest.mark.gpu


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


def test_decode_long_cache_many_splits():
    q = randn(2, 1, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(2, 131072, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.tensor([131072, 70001], dtype=torch.int32, device=DEVICE)
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    ref, _, base = expected(q, k_cache, v_cache, seqlens.tolist())
    assert_attention_close(out, ref, base)


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


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
def test_decode_with_rotary_bf16(interleaved):
    """Rotary on q and the appended k at real sizes in bf16 (the interpreter's bf16 is not trusted)."""
    from test_decode import _rotary_table

    from flashtile import reference
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


@pytest.mark.parametrize("case", ["q64-k2048-d64-rotary", "q16-k128k-d256-local-alibi"])
def test_flash_attn_kvcache_cases(case):
    """flash-attn 2.8.3's test_flash_attn_kvcache cases that failed before every tile was held to the sm90 compiler:
    64 new tokens at D=64, MQA 6/1, rotary, left padding (PassManager::run failed); 16 queries over a 128k cache at
    D=256 with a window and ALiBi, one split (out of shared memory)."""
    if case.startswith("q64"):
        many_rows_case(64, 2048, 64, 6, 1, rotary_dim=64)
    else:
        many_rows_case(16, 131072, 256, 6, 1, local=True, alibi=True, new_kv=False, num_splits=1)


@pytest.mark.parametrize("layout", ["head-major", "key-major", "paged256"])
def test_default_decode_reads_no_index_back_and_stays_inside(layout, monkeypatch):
    """The default settings read no index value back to the host (no sync: the call runs under CUDA graph capture
    as it is) and cache_seqlens past the capacity, or pages past the pool, stay inside the cache on every kernel the
    dispatch picks here: the warp-specialized one (head-major, one split), the portable one by TMA boxes (key-major,
    pages of 256). The cache sits between NaN guards that must stay NaN and out of the output."""
    batch, capacity, nheads, nheads_k, head_dim = 32, 4096, 32, 8, 128
    q = randn(batch, 1, nheads, head_dim, dtype=torch.bfloat16)
    if layout == "head-major":
        (k_cache, k_buffer), (v_cache, v_buffer) = (_guarded(batch, nheads_k, capacity, head_dim,
                                                             dtype=torch.bfloat16) for _ in range(2))
        k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        kwargs = {}
    elif layout == "key-major":
        (k_cache, k_buffer), (v_cache, v_buffer) = (_guarded(batch, capacity, nheads_k, head_dim, dtype=torch.bfloat16)
                                                    for _ in range(2))
        kwargs = {}
    else:
        pages = batch * capacity // 256
        (k_cache, k_buffer), (v_cache, v_buffer) = (_guarded(pages, 256, nheads_k, head_dim, dtype=torch.bfloat16)
                                                    for _ in range(2))
        table = torch.randperm(pages, device=DEVICE).to(torch.int32).view(batch, capacity // 256)
        table[-1, -1], table[0, 0] = pages + 5, -7
        kwargs = dict(block_table=table)
    seqlens = _i32([capacity + 100] * (batch - 1) + [-3])
    launches = _decode_launches(monkeypatch)
    out = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, **kwargs)
    torch.cuda.synchronize()
    assert out.isfinite().all() and _guards_intact(k_buffer) and _guards_intact(v_buffer)
    assert bool(launches["hopper"]) == (layout == "head-major")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a host read would fail the capture
        captured = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, **kwargs)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, out)


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
