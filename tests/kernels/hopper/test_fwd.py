"""The sm90 forward (kernels/hopper/fwd.py, fwd_launch.py, fwd_schedule.py). On any machine: its launch arguments,
schedules and dispatch (only the calls the kernel covers); it compiles for sm90 in tests/tools/test_compile_sm90.py.
GPU tier (`pytest -m gpu`, the forward through the API on both backends): real sizes, bf16 and fp16, against the
float64 reference."""
import dataclasses
import sys

import pytest
import torch
from bwd_checks import check_sinks
from helpers import (
    DTYPE_IDS,
    ROOT,
    assert_attention_close,
    poisoned_outputs,
    randn,
    torch_attention,
    torch_attention_varlen,
    varlen_inputs,
)

import flashtile
from flashtile import checks, configs, dispatch, reference
from flashtile.bench import inputs
from flashtile.kernels.common.tiles import head_dim_pad, num_sms
from flashtile.kernels.hopper import fwd as fwd_hopper
from flashtile.kernels.hopper import fwd_launch, fwd_schedule
from flashtile.kernels.hopper.common import GLUON_VERSION_OK


def test_supports_half_precision_and_sliding_windows():
    """Full, causal and sliding windows in bf16 and fp16, batch mode and packed; float32 runs the portable kernel."""
    q, k, v = (torch.randn(1, 64, 2, 128, dtype=torch.bfloat16) for _ in range(3))
    ok = GLUON_VERSION_OK
    for window in ((-1, -1), (-1, 0), (16, 0), (16, 16), (-1, 16), (16, -1)):
        assert fwd_launch.supports(q, k, v, window) == ok
        assert fwd_launch.supports(q[0], k[0], v[0], window) == ok  # packed
    assert not fwd_launch.supports(q.float(), k.float(), v.float(), (-1, -1))


@pytest.mark.skipif(not GLUON_VERSION_OK, reason="the Gluon kernels are written for triton 3.6")
def test_supports_packed_qkv_and_refuses_v_addressed_unlike_k():
    """Slices of one qkv (flash_attn_qkvpacked_func's (batch, seqlen, 3, nheads, headdim), SDPA on a fused projection
    (batch, nheads, seqlen, headdim) views of it, packed varlen) read in place; V in another layout than K does not
    (the kernel reads both at K's coordinates)."""
    qkv = torch.randn(2, 64, 3, 4, 128, dtype=torch.bfloat16)
    assert fwd_launch.supports(*qkv.unbind(2), (-1, 0))
    sdpa = qkv.permute(2, 0, 3, 1, 4)  # as F.scaled_dot_product_attention gets them
    assert fwd_launch.supports(*(t.transpose(1, 2) for t in sdpa), (-1, -1))
    assert fwd_launch.supports(*torch.randn(100, 3, 4, 128, dtype=torch.bfloat16).unbind(1), (-1, 0))
    q, k, v = (torch.randn(1, 64, 2, 128, dtype=torch.bfloat16) for _ in range(3))
    assert not fwd_launch.supports(q, k, v.transpose(1, 2).contiguous().transpose(1, 2), (-1, -1))


def test_not_chosen_off_sm90():
    q = torch.randn(1, 64, 2, 128, dtype=torch.bfloat16)
    assert dispatch.hopper_forward_config(q, q, q, (-1, -1)) is None  # a CPU tensor: no sm90 here


def test_launch_arguments():
    batch, seqlen, nheads, nheads_k, head_dim = 2, 300, 8, 2, 128
    q = torch.randn(batch, seqlen, nheads, head_dim, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, seqlen, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(batch, nheads, seqlen)
    cfg = dataclasses.replace(configs.FWD_HOPPER[(128, True)], persistent=False)
    grid, args, kwargs = fwd_launch.launch_args(q, k, v, out, lse, None, None, None, 0.125, (-1, 0), True, cfg)
    n_m = -(-seqlen // cfg.block_m)
    n_pairs = -(-n_m // 2) * batch * nheads
    assert grid == (n_pairs, )  # one program per pair of Q tiles
    persistent = dataclasses.replace(cfg, persistent=True)
    assert fwd_launch.launch_args(q, k, v, out, lse, None, None, None, 0.125, (-1, 0), True, persistent)[0] == (
        min(n_pairs, num_sms(q.device)), )  # at most one program per SM
    shorter = dataclasses.replace(persistent, persistent_max_seqlen=seqlen - 1)  # persistent up to shorter rows
    assert fwd_launch.launch_args(q, k, v, out, lse, None, None, None, 0.125, (-1, 0), True, shorter)[0] == (n_pairs, )
    q_desc, k_desc, v_desc = args[:3]
    assert q_desc.block_shape == [64, head_dim]  # 64 rows to each consumer warpgroup
    assert k_desc.block_shape == v_desc.block_shape == [cfg.block_n, head_dim]
    sw = kwargs["SWITCHES"]
    assert sw.MASK_RIGHT and not sw.MASK_LEFT and sw.BOTTOM_RIGHT and not sw.IS_VARLEN
    assert sw.STAGES == cfg.num_stages and sw.REGS == cfg.consumer_regs
    named = dict(zip(fwd_hopper.flash_fwd_hopper_kernel.arg_names, args))
    assert named["right"] == named["left"] == 0  # no window
    assert named["group"] == nheads // nheads_k and named["nheads"] == nheads
    assert (named["q_rows_b"], named["q_col_h"], named["k_col_h"]) == (seqlen, head_dim, head_dim)
    assert named["seqlen_q"] == named["seqlen_k"] == seqlen
    assert named["n_bh"] == batch * nheads and named["n_m"] == n_m
    assert kwargs["SWITCHES"].SCHEDULE == (1 if cfg.balanced else 0)  # causal: pairs of Q tiles


@pytest.mark.parametrize("window, sides", [((256, 0), (True, True, 0, 256)), ((100, 100), (True, True, 100, 100)),
                                           ((128, -1), (False, True, 0, 128)), ((-1, 64), (True, True, 64, 1300)),
                                           ((0, 0), (True, True, 0, 0)), ((-1, 0), (True, False, 0, 0))],
                         ids=lambda w: f"w{w[0]}_{w[1]}" if len(w) == 2 else None)
def test_window_launch_arguments(window, sides):
    """A sliding window: (MASK_RIGHT, MASK_LEFT) and the runtime sides (right, left), a window open to the left taking a
    side no row reaches (max(Nq, Nk); packed: max of the total rows); the non-causal schedule (single Q tiles when
    persistent), no claims, FROZEN_MAX in bf16 with two consumer warpgroups (its counter holds the redo queue), not with
    D=64's three. (-1, 0) is plain causal."""
    q = torch.randn(2, 1000, 8, 128, dtype=torch.bfloat16)
    k = torch.randn(2, 1300, 2, 128, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(2, 8, 1000)
    causal = window == (-1, 0)
    cfg = configs.FWD_HOPPER[(128, causal)]
    assert cfg.frozen_max and cfg.block_m == 128
    grid, args, kwargs = fwd_launch.launch_args(q, k, k, out, lse, None, None, None, 0.125, window, True, cfg)
    named = dict(zip(fwd_hopper.flash_fwd_hopper_kernel.arg_names, args))
    sw = kwargs["SWITCHES"]
    assert (sw.MASK_RIGHT, sw.MASK_LEFT, named["right"], named["left"]) == sides
    assert sw.FROZEN_MAX and named["counter"].numel() == fwd_schedule.counter_size(cfg, causal, q, None, None)
    if not causal:
        assert sw.SCHEDULE == (2 if cfg.persistent else 1)
        three = configs.FWD_HOPPER[(64, False)]
        assert three.frozen_max and three.block_m == 192
        q64, k64 = q[..., :64].contiguous(), k[..., :64].contiguous()
        _, args, kwargs = fwd_launch.launch_args(q64, k64, k64, q64, lse, None, None, None, 0.125, window, True, three)
        assert not kwargs["SWITCHES"].FROZEN_MAX and dict(zip(fwd_hopper.flash_fwd_hopper_kernel.arg_names,
                                                               args))["counter"] is None
    cu_q, cu_k = torch.tensor([0, 1000, 2000], dtype=torch.int32), torch.tensor([0, 1300, 2600], dtype=torch.int32)
    _, args, kwargs = fwd_launch.launch_args(q.flatten(0, 1), k.flatten(0, 1), k.flatten(0, 1), out.flatten(0, 1),
                                             lse.transpose(0, 1).flatten(1), cu_q, cu_k, 1000, 0.125, window, True, cfg)
    named = dict(zip(fwd_hopper.flash_fwd_hopper_kernel.arg_names, args))
    packed_left = 2600 if window[0] < 0 and window != (-1, 0) else sides[3]
    assert kwargs["SWITCHES"].IS_VARLEN and (named["right"], named["left"]) == (sides[2], packed_left)


def test_schedule():
    """Which work items the grid's programs take (kernels/hopper/fwd_schedule.work_item): causal or not persistent,
    pairs of Q tiles (light ones last with ``balanced``); non-causal persistent, single Q tiles (but with one Q tile,
    pairs); the grid covers them, at most one program per SM when persistent."""
    batch, nheads = 2, 8
    cfg = configs.HopperFwdConfig(block_m=128, block_n=128, num_stages=2, persistent=True)
    for seqlen, causal, persistent, balanced, schedule in [(1000, True, True, True, 1), (1000, False, True, True, 2),
                                                          (1000, False, False, True, 1), (1000, False, True, False, 0),
                                                          (100, False, True, True, 1), (1, False, True, True, 1)]:
        q = torch.randn(batch, seqlen, nheads, 128, dtype=torch.bfloat16)
        lse = torch.empty(batch, nheads, seqlen)
        run = dataclasses.replace(cfg, persistent=persistent, balanced=balanced)
        grid, args, kwargs = fwd_launch.launch_args(q, q, q, torch.empty_like(q), lse, None, None, None, 0.125,
                                                    checks.window((-1, -1), causal), True, run)
        n_m = -(-seqlen // 128)
        work = batch * nheads * (n_m if schedule == 2 else -(-n_m // 2))
        assert kwargs["SWITCHES"].SCHEDULE == schedule
        assert grid == ((min(work, num_sms(q.device)) if persistent else work), )


def test_claims_launch_arguments():
    """configs.HopperFwdConfig.claims takes SCHEDULE 3 where it applies (causal, persistent, equal lengths, two Q
    tiles or more), with a zeroed int32 counter, the tail's heads (claims rounds of pairs over the SMs) and one
    program per SM at most over as many items as tools/fwd_schedule_model.claimed_items (which checks that the
    order takes each Q tile once) lists; elsewhere the static order. The counter also holds FROZEN_MAX's queue (a
    place per head, Q tile and consumer warpgroup) in bf16; fp16 gets a counter only for claims."""
    sys.path.insert(0, str(ROOT / "tools"))
    import fwd_schedule_model
    cfg = dataclasses.replace(configs.FWD_HOPPER[(64, True)], min_seqlen_q=0, below=None)
    assert cfg.claims > 0
    batch, nheads, head_dim = 3, 16, 64
    sms = num_sms(torch.device("cpu"))
    for seqlen, causal, claims, varlen in [(1000, True, 2, False), (4096, True, 1, False), (1000, False, 2, False),
                                           (150, True, 2, False), (1000, True, 0, False), (1000, True, 2, True)]:
        run = dataclasses.replace(cfg, claims=claims)
        q = torch.randn(batch, seqlen, nheads, head_dim, dtype=torch.bfloat16)
        lse = torch.empty(batch, nheads, seqlen)
        cu = max_seqlen = None
        if varlen:
            q, lse = q.flatten(0, 1), torch.empty(nheads, batch * seqlen)
            cu, max_seqlen = torch.arange(0, batch * seqlen + 1, seqlen, dtype=torch.int32), seqlen
        grid, args, kwargs = fwd_launch.launch_args(q, q, q, torch.empty_like(q), lse, cu, cu, max_seqlen, 0.125,
                                                    checks.window((-1, -1), causal), True, run)
        named = dict(zip(fwd_hopper.flash_fwd_hopper_kernel.arg_names, args))
        n_m = -(-seqlen // cfg.block_m)
        counter = named["counter"]  # the claims counter and FROZEN_MAX's queue (bf16)
        assert counter.dtype == torch.int32 and not counter.any()
        assert counter.numel() == fwd_schedule.REDO_QUEUE + batch * nheads * n_m * cfg.block_m // 64
        if causal and claims and not varlen and n_m > 1:
            assert kwargs["SWITCHES"].SCHEDULE == 3
            assert named["tail_heads"] == min(batch * nheads, -(-claims * sms // -(-n_m // 2)))
            items = fwd_schedule_model.claimed_items(n_m, batch * nheads, sms, claims)
            assert grid == (min(len(items), sms), )
        else:
            assert kwargs["SWITCHES"].SCHEDULE != 3
        fp16 = fwd_launch.launch_args(q.half(), q.half(), q.half(), torch.empty_like(q.half()), lse, cu, cu, max_seqlen,
                                      0.125, checks.window((-1, -1), causal), True, run)  # FROZEN_MAX is for bf16 only
        assert fp16[2]["SWITCHES"].FROZEN_MAX is False and fp16[2]["SWITCHES"].SCHEDULE == kwargs["SWITCHES"].SCHEDULE
        fp16_counter = dict(zip(fwd_hopper.flash_fwd_hopper_kernel.arg_names, fp16[1]))["counter"]
        assert (fp16_counter is None) == (kwargs["SWITCHES"].SCHEDULE != 3)
        if fp16_counter is not None:
            assert fp16_counter.numel() == 1


def test_dispatch_by_head_dim_mask_and_query_rows(monkeypatch):
    """On sm90 (pretended here) D=64 takes the Hopper kernel from configs' min_seqlen_q query rows (the longest
    sequence when packed), three consumer warpgroups both masks; D=128 always, Q in registers from its threshold."""
    monkeypatch.setattr(dispatch, "arch", lambda device: (9, 0))
    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(configs, "FWD_BACKEND", "auto")

    def picked(seqlen, head_dim, causal, packed_max=None):
        q = torch.randn(1, seqlen, 2, head_dim, dtype=torch.bfloat16)
        if packed_max is not None:
            q = q[0]
        return dispatch.hopper_forward_config(q, q, q, (-1, 0) if causal else (-1, -1), packed_max)

    if not GLUON_VERSION_OK:
        assert picked(16384, 64, False) is None and picked(16, 128, False) is None
        return
    full = configs.FWD_HOPPER[(64, False)]
    assert full.min_seqlen_q > 1 and full.below is None
    assert picked(full.min_seqlen_q - 1, 64, False) is None
    assert picked(full.min_seqlen_q, 64, False) is full
    assert picked(full.min_seqlen_q, 64, False, packed_max=full.min_seqlen_q) is full
    assert picked(full.min_seqlen_q, 64, False, packed_max=full.min_seqlen_q - 1) is None
    three = configs.FWD_HOPPER[(64, True)]
    two = three.below
    assert (three.block_m, two.block_m, two.below) == (192, 128, None) and three.min_seqlen_q > two.min_seqlen_q > 1
    assert picked(two.min_seqlen_q - 1, 64, True) is None
    assert picked(two.min_seqlen_q, 64, True) is two and picked(three.min_seqlen_q - 1, 64, True) is two
    assert picked(three.min_seqlen_q, 64, True) is three
    for causal in (False, True):
        top = configs.FWD_HOPPER[(128, causal)]
        assert top.q_regs and not top.below.q_regs and top.below.below is None
        assert picked(16, 128, causal) is top.below and picked(top.min_seqlen_q - 1, 128, causal) is top.below
        assert picked(top.min_seqlen_q, 128, causal) is top


def test_launch_arguments_with_three_consumer_warpgroups():
    """D=64's config: 192-row Q tiles, read 64 rows per consumer; 16 warps enter with at most 128 registers
    (16 x 32 x 128 = the 64K-register file) and the consumers ask for 160."""
    cfg = configs.FWD_HOPPER[(64, False)]
    assert cfg.block_m == 192 and cfg.block_m // 64 == 3
    assert 16 * 32 * cfg.maxnreg <= 65536 and 128 * (3 * cfg.consumer_regs + 24) <= 65536
    batch, seqlen, nheads = 2, 1000, 4
    q, k, v = (torch.randn(batch, seqlen, nheads, 64, dtype=torch.bfloat16) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(batch, nheads, seqlen)
    grid, args, kwargs = fwd_launch.launch_args(q, k, v, out, lse, None, None, None, 0.125, (-1, -1), True, cfg)
    named = dict(zip(fwd_hopper.flash_fwd_hopper_kernel.arg_names, args))
    assert named["n_m"] == 6 and named["n_bh"] == batch * nheads  # 1000 rows: 6 tiles of 192
    assert kwargs["SWITCHES"].SCHEDULE == 2 and grid == (min(6 * batch * nheads, num_sms(q.device)), )  # single tiles
    assert args[0].block_shape == [64, 64]
    assert (kwargs["BLOCK_M"], kwargs["SWITCHES"].REGS, kwargs["maxnreg"], kwargs["num_warps"]) == (192, 160, 128, 4)


def test_schedule_model_takes_every_tile_once():
    """tools/fwd_schedule_model.py (the grid model behind docs/perf/forward.md v29) replicates the kernel's
    _item: each of its orders takes every (head, Q tile) exactly once, for lengths 1-1,300 and grids of 1-132."""
    sys.path.insert(0, str(ROOT / "tools"))
    import fwd_schedule_model
    fwd_schedule_model.check_bijection()
    assert fwd_schedule_model.busiest(2048, 256, 192, False, 2) < fwd_schedule_model.busiest(2048, 256, 192, False, 0)


def test_dispatch_leaves_narrow_windows_and_caps_where_the_portable_kernel_is_faster(monkeypatch):
    """On sm90 (pretended here) a config's ``min_window`` sends windows of fewer keys a row (left + right + 1; a side
    of -1 is unbounded) to the portable kernel, and ``softcap=False`` capped scores: D=64 both, D=128 windows under
    512 keys, D=256 neither."""
    monkeypatch.setattr(dispatch, "arch", lambda device: (9, 0))
    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(configs, "FWD_BACKEND", "auto")
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernels are written for triton 3.6")

    def picked(head_dim, window, softcap=0.0):
        q = torch.randn(1, 4096, 2, head_dim, dtype=torch.bfloat16)
        return dispatch.hopper_forward_config(q, q, q, window, softcap=softcap)

    assert dispatch.window_keys((4095, 0)) == dispatch.window_keys((2047, 2048)) == 4096
    assert dispatch.window_keys((-1, 64)) == dispatch.window_keys((64, -1)) == dispatch.window_keys((-1, 0)) == 1 << 31
    for head_dim, narrowest in ((64, 4096), (128, 512), (256, 1)):
        full = configs.FWD_HOPPER[(head_dim, False)]
        assert full.min_window == (0 if head_dim == 256 else narrowest)
        assert picked(head_dim, (narrowest - 1, 0)) is full and picked(head_dim, (-1, 64)) is full
        if narrowest > 1:
            assert picked(head_dim, (narrowest - 2, 0)) is None and picked(head_dim, (0, narrowest - 2)) is None
        for window in ((-1, -1), (-1, 0)):
            assert (picked(head_dim, window, softcap=50.0) is None) == (head_dim == 64), (head_dim, window)
    q = torch.randn(1, 4096, 2, 64, dtype=torch.bfloat16)
    assert dispatch.forward(q, q, q, (-1, 0), softcap=50.0).kernel == "portable/fwd.py"
    assert dispatch.forward(q, q, q, (255, 0)).kernel == "portable/fwd.py"


def every_window_and_cap(monkeypatch):
    """FWD_HOPPER with every entry (and those below it) taking any window and softcap: the kernel's coverage, where
    dispatch leaves the call to the portable kernel as faster (``min_window``, ``softcap``)."""
    def opened(c):
        return None if c is None else dataclasses.replace(c, min_window=0, softcap=True, below=opened(c.below))
    monkeypatch.setattr(configs, "FWD_HOPPER", {key: opened(c) for key, c in configs.FWD_HOPPER.items()})


# GPU tier (`pytest -m gpu`): each test on both forward backends (forward_backend), real sizes, bf16 and fp16, against
# the float64 reference.
LOW = [torch.bfloat16, torch.float16]


@pytest.fixture(params=["auto", "portable"])
def forward_backend(request, monkeypatch):
    """Every test runs twice on sm90: "auto" takes the warp-specialized Hopper kernel wherever it applies
    (the portable kernel elsewhere), "portable" keeps to the portable one."""
    monkeypatch.setattr(configs, "FWD_BACKEND", request.param)
    return request.param


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
def test_hopper_kernel_covers_the_common_layouts(forward_backend):
    """The Hopper kernel, not the fallback, runs the shapes users time: flash-attn and SDPA layouts, GQA."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper kernel is for sm90")
    for head_dim in (64, 96, 128, 192, 256):  # D=64 only from 1024 query rows (causal 2048; configs.FWD_HOPPER)
        for dtype in LOW:
            q = randn(2, 1000, 8, head_dim, dtype=dtype)
            k = randn(2, 1000, 2, head_dim, dtype=dtype)
            heads_first = randn(2, 8, 1000, head_dim, dtype=dtype).transpose(1, 2)
            for window in ((-1, -1), (-1, 0)):
                for layout in (q, heads_first):
                    config = dispatch.hopper_forward_config(layout, k, k, window)
                    expected = forward_backend == "auto" and head_dim != 64
                    assert (config is not None) == expected, (head_dim, dtype, window)
    assert dispatch.hopper_forward_config(q[..., :-8], k[..., :-8], k[..., :-8], (-1, -1)) is None  # head dim 248
    assert (dispatch.hopper_forward_config(q, k, k, (128, 0)) is not None) == (forward_backend == "auto")  # a window


def check(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal, window_size=(-1, -1)):
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    k = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    v = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    check_inputs(q, k, v, causal, window_size)


def check_inputs(q, k, v, causal, window_size=(-1, -1)):
    """O and LSE of flash_attn_func on q, k, v against the float64 reference."""
    with poisoned_outputs():
        out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=causal, window_size=window_size,
                                                return_attn_probs=True)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, window_size=window_size)
    assert_attention_close(out, ref, torch_attention(q, k, v, causal, window_size), lse, ref_lse)


def check_varlen(seqlens_q, seqlens_k, head_dim, causal, window_size=None):
    """Packed sequences against the reference; returns the Hopper config the call took (None: the portable kernel)."""
    q, k, v, cu_q, cu_k = varlen_inputs(seqlens_q, seqlens_k, 8, 2, head_dim, torch.bfloat16)
    window_size = window_size or ((-1, 0) if causal else (-1, -1))
    with poisoned_outputs():
        out, lse, _ = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                                                       causal=causal, window_size=window_size, return_attn_probs=True)
    ref, ref_lse = reference.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, window_size=window_size)
    assert_attention_close(out, ref, torch_attention_varlen(q, k, v, cu_q, cu_k, causal, window_size), lse, ref_lse)
    return dispatch.hopper_forward_config(q, k, v, window_size, max(seqlens_q))


def check_hopper_config(cfg, head_dim, causal, monkeypatch):
    """``cfg`` forced onto ragged lengths, causal with Nq != Nk, GQA and MQA, fp16, packed sequences with empty
    ones and many short ones (a program's consecutive items then leave the same warpgroups idle); then bitwise
    repeatable."""
    cfg = dataclasses.replace(cfg, min_seqlen_q=0, below=None)
    monkeypatch.setattr(configs, "FWD_HOPPER", {(head_dim_pad(head_dim), causal): cfg})
    for seqlen_q, seqlen_k in ((1, 1), (17, 17), (113, 203), (203, 113), (1023, 1023), (1500, 700)):
        check(2, seqlen_q, seqlen_k, 8, 2, head_dim, torch.bfloat16, causal)
    check(1, 4096, 4096, 4, 1, head_dim, torch.float16, causal)
    assert check_varlen([300, 0, 2048, 77, 193], [129, 40, 2048, 0, 500], head_dim, causal) is cfg
    assert check_varlen([17, 40, 64, 1, 33] * 8, [17, 90, 64, 5, 200] * 8, head_dim, causal) is cfg
    q, k, v = (randn(2, 3000, 16, head_dim, dtype=torch.bfloat16) for _ in range(3))
    first = flashtile.flash_attn_func(q, k, v, causal=causal)
    assert all(torch.equal(first, flashtile.flash_attn_func(q, k, v, causal=causal)) for _ in range(2))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
def test_a_repeated_forward_replays_with_each_calls_tensors(head_dim, causal, monkeypatch):
    """From a shape's second call the sm90 forward is replayed (kernels/common/replay.py): its descriptors must
    follow each call's tensors, at new addresses and at addresses seen before with new contents."""
    from flashtile.kernels.common import replay
    if torch.cuda.get_device_capability() != (9, 0) or not GLUON_VERSION_OK:
        pytest.skip("the sm90 forward")
    replayed = []
    launch = replay.Replay.launch
    monkeypatch.setattr(replay.Replay, "launch", lambda self, *a: (replayed.append(self), launch(self, *a))[1])
    kept = [randn(1, 2100, 8, head_dim, dtype=torch.bfloat16) for _ in range(3)]
    assert dispatch.hopper_forward_config(*kept, (-1, 0) if causal else (-1, -1)) is not None
    for turn in range(4):  # turns 0 and 3 at the same addresses, Q's contents new in turn 3
        if turn == 3:
            kept[0].copy_(randn(*kept[0].shape, dtype=torch.bfloat16))
        check_inputs(*(kept if turn in (0, 3) else (randn(1, 2100, 8, head_dim, dtype=torch.bfloat16)
                                                    for _ in range(3))), causal)
    assert replayed or not replay.REPLAY_OK


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", LOW, ids=lambda t: DTYPE_IDS[t])
def test_a_repeated_short_forward_is_kept_with_each_calls_tensors(dtype, causal):
    """Short calls (the portable kernel on sm90 at D=64 below 1k rows; every call on the "portable" backend) are kept
    by their launch key after the first (ops._FORWARD_AGAIN): later calls launch the replay with their own tensors, at
    new addresses and at addresses seen before with new contents, sinks too."""
    from flashtile import ops
    from flashtile.kernels.common import replay
    kept = [randn(8, 256, 16, 64, dtype=dtype) for _ in range(3)]
    for turn in range(4):  # turns 0 and 3 at the same addresses, Q's contents new in turn 3
        if turn == 3:
            kept[0].copy_(randn(*kept[0].shape, dtype=dtype))
        check_inputs(*(kept if turn in (0, 3) else (randn(8, 256, 16, 64, dtype=dtype) for _ in range(3))), causal)
    assert len(ops._FORWARD_AGAIN) or not replay.can_replay()
    for _ in range(3):  # each call's own sinks
        check_sinks(2, 100, 100, 16, 16, 64, dtype, causal, backward=False)


def _large_cases():
    for head_dim in (64, 128, 256):
        for seqlen in (1024, 4096, 16384):
            for dtype in LOW:
                if seqlen == 16384 and dtype != torch.bfloat16:
                    continue
                yield pytest.param(seqlen, head_dim, dtype, id=f"n{seqlen}-d{head_dim}-{DTYPE_IDS[dtype]}")


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen, head_dim, dtype", list(_large_cases()))
def test_large(seqlen, head_dim, dtype, causal):
    check(1, seqlen, seqlen, 2, 2, head_dim, dtype, causal)


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("dtype", LOW, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("seqlens", [(1, 4097), (1000, 3000), (3000, 1000), (777, 777)],
                         ids=lambda s: f"q{s[0]}k{s[1]}")
@pytest.mark.parametrize("head_dim", [40, 64, 96, 128, 256], ids=lambda d: f"d{d}")
def test_ragged_causal_gqa(head_dim, seqlens, dtype):
    check(2, *seqlens, 8, 2, head_dim, dtype, causal=True)


WINDOWS = [(256, 0), (100, 100), (128, -1), (-1, 64), (0, 0)]
WINDOW_SHAPES = [(2, 2048, 2048, 4, 1), (2, 1100, 2900, 8, 2), (1, 2900, 1100, 8, 8)]


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("dtype", LOW, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("window_size", WINDOWS, ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("shape", WINDOW_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256], ids=lambda d: f"d{d}")
def test_window(head_dim, shape, window_size, dtype, forward_backend, monkeypatch):
    """A sliding window (left, right): a causal window, a symmetric one, one side only, a single key; MQA, GQA and
    MHA, Nq < Nk and Nq > Nk (bottom-right: rows with no key at all give O = 0, LSE = -inf), ragged tiles; on sm90
    ("auto") the Hopper kernel runs it (every_window_and_cap), items starting at their first row's first K/V tile."""
    every_window_and_cap(monkeypatch)
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    k = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    kernel = dispatch.forward(q, k, k, window_size).kernel
    if torch.cuda.get_device_capability() == (9, 0):
        assert kernel == ("hopper/fwd.py" if forward_backend == "auto" else "portable/fwd.py")
    check(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal=False, window_size=window_size)


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("window_size", [(64, 0), (30, 30), (0, 100)], ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
def test_window_on_short_and_ragged_lengths(head_dim, window_size, forward_backend, monkeypatch):
    """The Hopper config of the head dim forced onto every length (dispatch keeps short calls on the portable kernel):
    one row, 17, 113 x 203 and back, 1023, where a window's first K/V tile is not the sequence's; bitwise repeatable."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's tile config")
    cfg = dataclasses.replace(configs.FWD_HOPPER[(head_dim, False)], min_seqlen_q=0, min_window=0, below=None)
    monkeypatch.setattr(configs, "FWD_HOPPER", {(head_dim, False): cfg})
    for seqlen_q, seqlen_k in ((1, 1), (1, 300), (17, 17), (113, 203), (203, 113), (1023, 1023)):
        check(2, seqlen_q, seqlen_k, 8, 2, head_dim, torch.bfloat16, False, window_size)
    q, k, v = (randn(2, 3000, 8, head_dim, dtype=torch.bfloat16) for _ in range(3))
    first = flashtile.flash_attn_func(q, k, v, window_size=window_size)
    assert all(torch.equal(first, flashtile.flash_attn_func(q, k, v, window_size=window_size)) for _ in range(2))


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("window_size", [(256, 0), (100, 100), (-1, 64)], ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
def test_window_varlen(head_dim, window_size, forward_backend, monkeypatch):
    """Packed sequences under a window, each with its own diagonal: empty ones, one row, Nq < Nk and Nq > Nk; on sm90
    ("auto") the Hopper kernel runs them (every_window_and_cap)."""
    every_window_and_cap(monkeypatch)
    config = check_varlen([300, 0, 2048, 1, 1500, 77], [129, 40, 2048, 300, 3000, 0], head_dim, False, window_size)
    if torch.cuda.get_device_capability() == (9, 0):
        assert (config is not None) == (forward_backend == "auto")


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("dtype", LOW, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("window_size", [(-1, -1), (-1, 0), (1000, 0)], ids=["full", "causal", "w1000_0"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256], ids=lambda d: f"d{d}")
def test_softcap(head_dim, window_size, dtype, forward_backend, monkeypatch):
    """flash-attn's softcap (Gemma 2's 50 on its attention scores: cap · tanh(score / cap)) on the sm90 forward
    ("auto", every_window_and_cap: D=64 takes the portable kernel by default): O and LSE against the float64
    reference, scores past the cap (q scaled up), GQA, Nq != Nk, on NaN-filled outputs; a call without the cap
    differs (the test sees the cap)."""
    every_window_and_cap(monkeypatch)
    q = randn(2, 2100, 8, head_dim, dtype=dtype, scale=16.0)
    k, v = (randn(2, 1700, 2, head_dim, dtype=dtype) for _ in range(2))
    if torch.cuda.get_device_capability() == (9, 0) and forward_backend == "auto":
        assert dispatch.forward(q, k, v, window_size, softcap=50.0).kernel == "hopper/fwd.py"
    with poisoned_outputs():
        out, lse, _ = flashtile.flash_attn_func(q, k, v, window_size=window_size, softcap=50.0, return_attn_probs=True)
    ref, ref_lse = reference.attention(q, k, v, window_size=window_size, softcap=50.0)
    base = reference.attention(q, k, v, window_size=window_size, softcap=50.0, upcast=False)[0]
    assert_attention_close(out, ref, base, lse, ref_lse)
    assert (flashtile.flash_attn_func(q, k, v, window_size=window_size) - out).abs().max() > 0.05


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("kind", ["large", "rising", "falling", "dominant"])
def test_window_inputs_beyond_the_normal(kind):
    """bf16 inputs whose scores are large, rise or fall along the keys or have one dominant key, under a causal
    window."""
    q, k, v = inputs.make(kind, 1, 4096, 8, 128, nheads_k=2)
    check_inputs(q, k, v, False, (700, 0))


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen(causal):
    check_varlen([1, 0, 2048, 300, 4000, 77], [1, 129, 2048, 5000, 4000, 0], 128, causal)


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
def test_sdpa_entry_point():
    q, k, v = (randn(2, 16, 2048, 128, dtype=torch.bfloat16) for _ in range(3))
    with poisoned_outputs():
        out = flashtile.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert_attention_close(out, ref, expected)


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
def test_deterministic(head_dim):
    q, k, v = (randn(4, 4096, 16, head_dim, dtype=torch.bfloat16) for _ in range(3))
    first = flashtile.flash_attn_func(q, k, v, causal=True)
    assert all(torch.equal(first, flashtile.flash_attn_func(q, k, v, causal=True)) for _ in range(3))


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
def test_large_logits_bf16():
    q = randn(1, 4096, 4, 128, dtype=torch.bfloat16, scale=30.0)
    k, v = (randn(1, 4096, 4, 128, dtype=torch.bfloat16) for _ in range(2))
    out = flashtile.flash_attn_func(q, k, v, causal=True)
    ref, _ = reference.attention(q, k, v, causal=True)
    assert_attention_close(out, ref, torch_attention(q, k, v, True))


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_three_consumer_warpgroups(causal, forward_backend, monkeypatch):
    """192-row Q tiles shared by three consumer warpgroups (D=64's config), forced onto every shape: ragged
    lengths, causal with Nq != Nk, GQA and MQA, fp16, packed sequences with empty ones; bitwise repeatable."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's tile config")
    three = configs.HopperFwdConfig(block_m=192, block_n=128, num_stages=3, consumer_regs=160, maxnreg=128,
                                    persistent=True)
    assert three.block_m // 64 == 3
    check_hopper_config(three, 64, causal, monkeypatch)


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
def test_d64_causal_config(forward_backend, monkeypatch):
    """D=64 causal's shipped config (three warpgroups, the softmax under P·V, items claimed from a counter), forced
    onto every shape."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's tile config")
    check_hopper_config(configs.FWD_HOPPER[(64, True)], 64, True, monkeypatch)


D256_OPTIONS = {"shipped": {}, "turns": dict(pingpong=True),
                "plain": dict(pingpong=True, overlap_pv=False, persistent=False, early_p=False, balanced=False)}


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("options", list(D256_OPTIONS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_d256_options(causal, options, forward_backend, monkeypatch):
    """D=256's config (64-key tiles, two stages), as shipped, with turns, and with none of its switches (run 25's
    config), forced onto every shape."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's tile config")
    cfg = dataclasses.replace(configs.FWD_HOPPER[(256, causal)], **D256_OPTIONS[options])
    check_hopper_config(cfg, 256, causal, monkeypatch)


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_o_through_the_last_k_tile(causal, forward_backend, monkeypatch):
    """configs.HopperFwdConfig.o_kstage (D=128: O turned into 16-byte row runs through each consumer's rows of the
    item's last K tile, which the loader then refills) on ragged, GQA/MQA, fp16 and packed shapes, persistent and
    not, so that a refilled stage that O still held would show; bitwise repeatable."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's option")
    for persistent in (True, False):
        cfg = dataclasses.replace(configs.FWD_HOPPER[(128, causal)], o_kstage=True, o_tma=False, persistent=persistent)
        check_hopper_config(cfg, 128, causal, monkeypatch)


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_early_p(causal, forward_backend, monkeypatch):
    """configs.HopperFwdConfig.early_p (P to 16 bits at the end of each step): off at D=128 (shipped on), on at D=64
    in three warpgroups with and without the softmax under P·V (shipped: on non-causal, without the overlap)."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's option")
    assert configs.FWD_HOPPER[(128, causal)].early_p
    check_hopper_config(dataclasses.replace(configs.FWD_HOPPER[(128, causal)], early_p=False), 128, causal, monkeypatch)
    for overlap_pv in (False, True):
        three = configs.HopperFwdConfig(block_m=192, block_n=128, num_stages=3, consumer_regs=160, maxnreg=128,
                                        persistent=True, early_p=True, overlap_pv=overlap_pv)
        check_hopper_config(three, 64, causal, monkeypatch)


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_o_by_tma_store(causal, forward_backend, monkeypatch):
    """configs.HopperFwdConfig.o_tma (D=128, two K/V stages: O by TMA stores from a tile per consumer, which the
    next item's epilogue waits for) on ragged, GQA/MQA, fp16 and packed shapes, persistent and not, and an output
    whose layout differs from Q's (plain stores then); bitwise repeatable."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's option")
    for persistent in (True, False):
        cfg = dataclasses.replace(configs.FWD_HOPPER[(128, causal)], o_tma=True, num_stages=2, persistent=persistent)
        check_hopper_config(cfg, 128, causal, monkeypatch)
    q = randn(2, 1024, 8, 128, dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)  # heads first
    k, v = (randn(2, 1024, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    with poisoned_outputs():
        out = flashtile.flash_attn_func(q, k, v, causal=causal)
    ref, _ = reference.attention(q, k, v, causal=causal)
    assert_attention_close(out, ref, torch_attention(q, k, v, causal, (-1, -1)))


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_q_in_registers(causal, forward_backend, monkeypatch):
    """configs.HopperFwdConfig.q_regs (D=128: Q·Kᵀ takes Q from registers, and the loader may refill its tile as
    soon as they are loaded) on and off, on ragged, GQA/MQA, fp16 and packed shapes, persistent and not."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's option")
    for q_regs in (True, False):
        for persistent in (True, False):
            cfg = dataclasses.replace(configs.FWD_HOPPER[(128, causal)], q_regs=q_regs, persistent=persistent)
            check_hopper_config(cfg, 128, causal, monkeypatch)


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("option", ["balanced"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_schedule_options_off(option, head_dim, causal, forward_backend, monkeypatch):
    """configs.HopperFwdConfig.balanced (light items last; non-causal persistent grids take single Q tiles) is on in
    the shipped configs (off in D=128 causal below 2k rows; test_d256_options runs D=256 without it), which the rest
    of the suite runs; here it is turned off in the head dim's top config. check_hopper_config's
    lengths 17, 203, 1023, 4096, the packed 300 and the 40 packed short ones leave one or two warpgroups of a last
    tile idle, and its outputs start as NaN, so a tile that no program takes shows."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's option")
    cfg = configs.FWD_HOPPER[(head_dim, causal)]
    assert getattr(cfg, option)
    check_hopper_config(dataclasses.replace(cfg, **{option: False}), head_dim, causal, monkeypatch)


def _claims_configs():
    for head_dim in (64, 128):
        for i, cfg in enumerate(configs.hopper_fwd_chain(configs.FWD_HOPPER[(head_dim, True)])):
            yield pytest.param(head_dim, i, id=f"d{head_dim}-config{i}")


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("head_dim, which", list(_claims_configs()))
def test_claims(head_dim, which, forward_backend, monkeypatch):
    """configs.HopperFwdConfig.claims (causal persistent grids claim each item from a counter: pairs of Q tiles in
    head order, then the last heads' tiles one at a time) forced onto each causal config of the head dim; 4 x 64
    heads of 1000 rows take pairs, then single tiles. Each launch's last claim sets the counter back to 0."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's option")
    from flashtile.kernels.hopper import fwd_schedule
    cfg = list(configs.hopper_fwd_chain(configs.FWD_HOPPER[(head_dim, True)]))[which]
    cfg = dataclasses.replace(cfg, claims=cfg.claims or 2, persistent_max_seqlen=1 << 31)
    check_hopper_config(cfg, head_dim, True, monkeypatch)
    check(4, 1000, 1000, 64, 8, head_dim, torch.bfloat16, True)
    torch.cuda.synchronize()
    assert fwd_schedule.COUNTERS and all(not c[:fwd_schedule.REDO_QUEUE].any() for c in fwd_schedule.COUNTERS.values())


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
def test_claims_under_cuda_graph(forward_backend, monkeypatch):
    """A launch captured in a CUDA graph claims from a counter of its own, which the graph zeroes before it (graphs
    replayed at once on two streams must not share one), not from the capturing stream's: two graphs of the same
    call replay to the eager result, one after the other and both at once on two streams."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's option")
    from flashtile.kernels.hopper import fwd_schedule
    cfg = dataclasses.replace(configs.FWD_HOPPER[(128, True)], claims=2, min_seqlen_q=0, below=None)
    monkeypatch.setattr(configs, "FWD_HOPPER", {(128, True): cfg})
    q, k, v = (randn(4, 1000, 32, 128, dtype=torch.bfloat16) for _ in range(3))
    expected = flashtile.flash_attn_func(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graphs, outs = [], []
    for _ in range(2):
        graph = torch.cuda.CUDAGraph()
        before = len(fwd_schedule.GRAPH_COUNTERS)
        with torch.cuda.graph(graph, stream=side):
            outs.append(flashtile.flash_attn_func(q, k, v, causal=True))
        assert len(fwd_schedule.GRAPH_COUNTERS) == before + 1
        assert (q.device, side.cuda_stream) not in fwd_schedule.COUNTERS
        graphs.append(graph)
    streams = [torch.cuda.Stream() for _ in graphs]
    for together in (False, True, True):
        for out in outs:
            out.fill_(float("nan"))
        torch.cuda.synchronize()
        for graph, stream in zip(graphs, streams):
            with torch.cuda.stream(stream):
                graph.replay()
            if not together:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        assert all(torch.equal(out, expected) for out in outs)


def check_rising_scores(head_dim, causal, kind, seqlen=3000, sinks=None, window_size=(-1, -1)):
    """``kind`` "rising": scores that rise along the keys, by about 100 log2 units in the query heads of KV head 0 and
    40 in KV head 1's; their rows move their reference up as the sums grow (kernels/hopper/fwd.py, _rebase) and none
    falls back. "dominant": one key (the middle one) 140 log2 units above the rest in KV head 0's query heads (P
    stays finite, nothing falls back); "past": 220 above, where P overflows float32, so those rows fall back
    to kernels/hopper/exact_rows.py. The other rows are random. Poisoned
    outputs show rows nobody stored. ``sinks``: learnable_sink (4,), against the reference with them; ``window_size``:
    a sliding window (the middle key inside some rows' windows)."""
    q = randn(2, seqlen, 4, head_dim, dtype=torch.bfloat16)
    k, v = (randn(2, seqlen, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    rises = {"rising": ((0, 100.0), (1, 40.0)), "dominant": ((0, 140.0), ), "past": ((0, 220.0), )}[kind]
    for kv_head, rise in rises:
        amplitude = (rise / 1.4427 * head_dim ** 0.5) ** 0.5  # q·k / sqrt(D) rises by this squared over the keys
        q[:, :, 2 * kv_head:2 * kv_head + 2, 0] = amplitude
        if kind == "rising":
            k[:, :, kv_head, 0] = torch.linspace(0, amplitude, seqlen, device=k.device)
        else:
            k[:, :, kv_head, 0] = 0.0
            k[:, seqlen // 2, kv_head, 0] = amplitude
    from flashtile.kernels.hopper import fwd_schedule
    for counter in fwd_schedule.COUNTERS.values():
        counter.zero_()
    with poisoned_outputs():
        out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=causal, window_size=window_size,
                                                return_attn_probs=True, learnable_sink=sinks)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, window_size=window_size, sinks=sinks)
    base = (torch_attention(q, k, v, causal, window_size) if sinks is None
            else reference.attention(q, k, v, causal=causal, window_size=window_size, sinks=sinks, upcast=False)[0])
    assert_attention_close(out, ref, base, lse, ref_lse)
    torch.cuda.synchronize()  # a launch that queued rows for exact_rows.redo set the counts back to 0
    counters = list(fwd_schedule.COUNTERS.values())
    fell_back = any(c[fwd_schedule.REDO_QUEUE:].any() for c in counters)
    assert fell_back == (kind == "past"), "rows fell back" if fell_back else "no rows fell back"
    assert all(not c[:fwd_schedule.REDO_QUEUE].any() for c in counters)


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("head_dim", [64, 96, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_frozen_max(head_dim, causal, forward_backend, monkeypatch):
    """configs.HopperFwdConfig.frozen_max (each K/V tile after an item's first exponentiated against that tile's
    row maxima, moved up as row sums grow), shipped in every config of the head dim: forced onto every shape, then
    on scores that rise along the keys (no row falls back) and on one key past float32's range (its rows recomputed
    exactly)."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's option")
    for cfg in configs.hopper_fwd_chain(configs.FWD_HOPPER[(head_dim_pad(head_dim), causal)]):
        assert cfg.frozen_max
        check_hopper_config(cfg, head_dim, causal, monkeypatch)
        check_rising_scores(head_dim, causal, "rising")
        check_rising_scores(head_dim, causal, "dominant")
        check_rising_scores(head_dim, causal, "past")


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("window_size", [(1000, 0), (700, 300), (-1, 500)], ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("head_dim", [96, 128], ids=lambda d: f"d{d}")  # D=256 takes no FROZEN_MAX
def test_frozen_max_under_a_window(head_dim, window_size, forward_backend):
    """FROZEN_MAX under a sliding window (bf16, two consumer warpgroups): each warpgroup keeps the running maximum up to
    the tile where its last row meets its first key (fwd._window_step), then freezes; scores that rise along the keys
    and a key 140 log2 units above the rest need no redo, one 220 above sends its rows to the redo, which masks the
    window too."""
    if torch.cuda.get_device_capability() != (9, 0) or forward_backend == "portable":
        pytest.skip("the Hopper kernel's option")
    q = randn(2, 3000, 4, head_dim, dtype=torch.bfloat16)
    _, _, kwargs = fwd_launch.launch_args(q, q, q, torch.empty_like(q), torch.empty(2, 4, 3000, device=q.device), None,
                                          None, None, 0.1, window_size, True,
                                          dispatch.forward(q, q, q, window_size).config)
    assert kwargs["SWITCHES"].FROZEN_MAX and kwargs["SWITCHES"].MASK_LEFT
    for kind in ("rising", "dominant", "past"):
        check_rising_scores(head_dim, False, kind, window_size=window_size)


@pytest.mark.gpu
@pytest.mark.usefixtures("forward_backend")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256], ids=lambda d: f"d{d}")
def test_sinks(head_dim, causal, forward_backend):
    """learnable_sink in the forward (Switches.HAS_SINK): O and LSE against float64, bf16 and fp16, GQA, Nq != Nk
    with rows that see no key (O = 0, LSE = the sink), a sink far above the scores; then rows that fall back to
    exact_rows (the "past" scores of check_rising_scores) with sinks."""
    for dtype in LOW:
        check_sinks(2, 2048, 2048, 8, 2, head_dim, dtype, causal, backward=False)
    check_sinks(2, 2500, 1200, 4, 1, head_dim, torch.bfloat16, causal, backward=False)
    check_sinks(1, 2048, 2048, 4, 4, head_dim, torch.bfloat16, causal, sink_scale=30.0, backward=False)
    if torch.cuda.get_device_capability() == (9, 0) and forward_backend == "auto" and head_dim != 256:
        assert dispatch.hopper_forward_config(*(randn(1, 2048, 4, head_dim, dtype=torch.bfloat16), ) * 3,
                                              (-1, 0) if causal else (-1, -1)) is not None
        check_rising_scores(head_dim, causal, "past", sinks=randn(4, dtype=torch.float32, scale=2.0))
