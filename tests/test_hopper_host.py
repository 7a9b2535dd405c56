"""The Hopper forward's host side, on any machine: the 2-D views its descriptors read must address exactly
the rows of each (batch, head), and the dispatch must only take calls the kernel covers. (The kernel
itself runs on sm90 only: tests/test_gpu_fwd.py; it compiles for sm90 here: tests/test_compile_sm90.py.)"""
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from flashtile import configs, dispatch
from flashtile.kernels.common.tiles import num_sms
from flashtile.kernels.hopper import common as hopper_common
from flashtile.kernels.hopper import fwd as fwd_hopper
from flashtile.kernels.hopper import fwd_launch, fwd_schedule
from flashtile.kernels.hopper.common import GLUON_VERSION_OK

ROOT = Path(__file__).resolve().parents[1]


def _rows(view, row_base, col, n, head_dim):
    return view[row_base:row_base + n, col:col + head_dim]


@pytest.mark.parametrize("layout", ["tokens-major", "heads-major"])
def test_view_addresses_each_head(layout):
    batch, seqlen, nheads, head_dim = 3, 5, 4, 8
    if layout == "tokens-major":
        t = torch.randn(batch, seqlen, nheads, head_dim)
    else:
        t = torch.randn(batch, nheads, seqlen, head_dim).transpose(1, 2)
    layout, rows_b, rows_h, col_h = hopper_common.view_layout(t, varlen=False)
    view = hopper_common.view(t, layout)
    assert view.data_ptr() == t.data_ptr() and view.stride(-1) == 1
    for b in range(batch):
        for h in range(nheads):
            got = _rows(view, b * rows_b + h * rows_h, h * col_h, seqlen, head_dim)
            assert torch.equal(got, t[b, :, h])


def test_view_addresses_each_packed_sequence():
    seqlens, nheads, head_dim = [2, 0, 5], 3, 16
    t = torch.randn(sum(seqlens), nheads, head_dim)
    layout, _, _, col_h = hopper_common.view_layout(t, varlen=True)
    view = hopper_common.view(t, layout)
    start = 0
    for n in seqlens:
        for h in range(nheads):
            assert torch.equal(_rows(view, start, h * col_h, n, head_dim), t[start:start + n, h])
        start += n


def test_views_the_kernel_cannot_read():
    qkv = torch.randn(2, 7, 3, 4, 64)  # q, k, v interleaved: a head's rows are not evenly spaced in a view
    assert hopper_common.view_layout(qkv[:, :, 0], varlen=False) is None
    assert hopper_common.view_layout(torch.randn(2, 7, 4, 64)[..., :32],
                                     varlen=False) is None  # a slice of the head dim
    assert hopper_common.view_layout(torch.randn(2, 7, 4, 64).transpose(-1, -2), varlen=False) is None


def test_supports_only_full_or_causal_half_precision():
    q, k, v = (torch.randn(1, 64, 2, 128, dtype=torch.bfloat16) for _ in range(3))
    ok = GLUON_VERSION_OK
    assert fwd_launch.supports(q, k, v, (-1, -1)) == ok
    assert fwd_launch.supports(q, k, v, (-1, 0)) == ok
    assert not fwd_launch.supports(q, k, v, (16, 0))  # sliding window
    assert not fwd_launch.supports(q.float(), k.float(), v.float(), (-1, -1))


def test_not_chosen_off_sm90():
    q = torch.randn(1, 64, 2, 128, dtype=torch.bfloat16)
    assert dispatch.hopper_forward_config(q, q, q, (-1, -1)) is None  # a CPU tensor: no sm90 here


def test_launch_arguments():
    batch, seqlen, nheads, nheads_k, head_dim = 2, 300, 8, 2, 128
    q = torch.randn(batch, seqlen, nheads, head_dim, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, seqlen, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(batch, nheads, seqlen)
    cfg = dataclasses.replace(configs.FWD_HOPPER[(128, True)], persistent=False)
    grid, args, kwargs = fwd_launch.launch_args(q, k, v, out, lse, None, None, None, 0.125, True, True, cfg)
    n_m = -(-seqlen // cfg.block_m)
    n_pairs = -(-n_m // 2) * batch * nheads
    assert grid == (n_pairs, )  # one program per pair of Q tiles
    persistent = dataclasses.replace(cfg, persistent=True)
    assert fwd_launch.launch_args(q, k, v, out, lse, None, None, None, 0.125, True, True, persistent)[0] == (
        min(n_pairs, num_sms(q.device)), )  # at most one program per SM
    shorter = dataclasses.replace(persistent, persistent_max_seqlen=seqlen - 1)  # persistent up to shorter rows
    assert fwd_launch.launch_args(q, k, v, out, lse, None, None, None, 0.125, True, True, shorter)[0] == (n_pairs, )
    q_desc, k_desc, v_desc = args[:3]
    assert q_desc.block_shape == [64, head_dim]  # 64 rows to each consumer warpgroup
    assert k_desc.block_shape == v_desc.block_shape == [cfg.block_n, head_dim]
    assert kwargs["SWITCHES"].CAUSAL and kwargs["SWITCHES"].BOTTOM_RIGHT and not kwargs["SWITCHES"].IS_VARLEN
    assert kwargs["STAGES"] == cfg.num_stages and kwargs["REGS"] == cfg.consumer_regs
    named = dict(zip(fwd_hopper.flash_fwd_hopper_kernel.arg_names, args))
    assert named["group"] == nheads // nheads_k and named["nheads"] == nheads
    assert (named["q_rows_b"], named["q_col_h"], named["k_col_h"]) == (seqlen, head_dim, head_dim)
    assert named["seqlen_q"] == named["seqlen_k"] == seqlen
    assert named["n_bh"] == batch * nheads and named["n_m"] == n_m
    assert kwargs["SWITCHES"].SCHEDULE == (1 if cfg.balanced else 0)  # causal: pairs of Q tiles


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
                                                    causal, True, run)
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
                                                    causal, True, run)
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
                                      0.125, causal, True, run)  # FROZEN_MAX is for bf16 only
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


def test_backward_launch_arguments():
    """kernels/hopper/bwd.py: a program per 128-key tile and (batch, KV head); Q, dO read as
    64-row tiles and K, V as the consumers' 64-key halves; the causal diagonal from the alignment."""
    from flashtile.kernels.hopper import bwd as bwd_hopper
    q = torch.randn(2, 300, 8, 128, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 500, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(2, 8, 300)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for bottom_right, diag in ((True, 200), (False, 0)):
        grid, args, kwargs = bwd_hopper.launch_args(q, k, v, q, dk, dv, lse, lse, 0.1, True, bottom_right)
        assert grid == (4, 4)
        assert [d.block_shape for d in args[:4]] == [[64, 128], [64, 128], [64, 128], [64, 128]]
        names = bwd_hopper.flash_bwd_dkdv_hopper_kernel.arg_names
        values = dict(zip(names, args))
        assert (values["seqlen_q"], values["seqlen_k"], values["diag"], values["group"]) == (300, 500, diag, 4)
        assert (values["q_rows_b"], values["q_col_h"], values["k_rows_b"], values["k_col_h"]) == (300, 128, 500, 128)
        assert kwargs["CAUSAL"] and kwargs["BLOCK_N"] == 128 and kwargs["BLOCK_M"] == 64


def test_backward_dispatch(monkeypatch):
    """On sm90 (pretended here) "auto" gives D=64, 128 and 256 batch-mode calls to the Gluon backward at any length,
    "portable" never; other head dims, windows and packed batches stay portable."""
    monkeypatch.setattr(dispatch, "arch", lambda device: (9, 0))
    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)
    ok = GLUON_VERSION_OK

    def taken(backend, seqlen_k, head_dim=128, window=(-1, 0), packed=False):
        monkeypatch.setattr(configs, "BWD_BACKEND", backend)
        q = torch.randn(1, 64, 4, head_dim, dtype=torch.bfloat16)
        k = torch.randn(1, seqlen_k, 2, head_dim, dtype=torch.bfloat16)
        return dispatch.takes_hopper_backward(q, k, k, q, window, packed)

    assert {d for d, _ in configs.BWD_HOPPER} == {64, 128, 256}
    for (head_dim, causal), config in configs.BWD_HOPPER.items():
        window = (-1, 0) if causal else (-1, -1)
        assert taken("auto", 1, head_dim, window) == taken("auto", 4096, head_dim, window) == ok
    assert not taken("portable", 4096)
    assert not taken("auto", 4096, head_dim=96)
    assert not taken("auto", 4096, window=(256, 0))
    assert not taken("auto", 4096, packed=True)


class _Recorder:
    """Stands in for a Gluon kernel: ``kernel[grid](*args, **kwargs)`` appends (name, args, kwargs) to calls."""

    def __init__(self, name, kernel, calls):
        self.name, self.arg_names, self.calls = name, kernel.arg_names, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, args, kwargs))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_runs_dq_first_and_hands_its_delta_to_dkdv(monkeypatch, causal):
    """The sm90 backward in two kernels is two launches: the Gluon dQ kernel (configs.HopperBwdConfig.dq_hopper),
    which writes delta, then the Gluon dK/dV kernel reading that same delta; each with the tiles of
    configs.BWD_HOPPER."""
    from flashtile.kernels.hopper import bwd as bwd_hopper
    from flashtile.kernels.hopper import bwd_dq as bwd_dq_hopper
    calls = []
    monkeypatch.setattr(bwd_hopper, "flash_bwd_dkdv_hopper_kernel",
                        _Recorder("dkdv", bwd_hopper.flash_bwd_dkdv_hopper_kernel, calls))
    monkeypatch.setattr(bwd_dq_hopper, "flash_bwd_dq_hopper_kernel",
                        _Recorder("dq", bwd_dq_hopper.flash_bwd_dq_hopper_kernel, calls))
    table = dict(configs.BWD_HOPPER)
    dq_hopper = configs.HopperDqConfig(block_n=128)
    for causal_ in (False, True):
        table[(128, causal_)] = dataclasses.replace(table[(128, causal_)], dq_hopper=dq_hopper, single_pass=False)
    monkeypatch.setattr(configs, "BWD_HOPPER", table)
    q, dout, out = (torch.randn(2, 256, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(2, 256, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(2, 4, 256)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    bwd_hopper.launch_bwd_hopper(dout, q, k, v, out, lse, *grads, 0.1, causal, True)
    assert [c[0] for c in calls] == ["dq", "dkdv"]
    _, dq_args, dq_kwargs = calls[0]
    config = table[(128, causal)]
    dq_named = dict(zip(bwd_dq_hopper.flash_bwd_dq_hopper_kernel.arg_names, dq_args))
    assert dq_named["dQ"] is grads[0] and dq_named["O"] is out and dq_named["LSE"] is lse
    assert dq_kwargs["CAUSAL"] == causal and dq_kwargs["BLOCK_N"] == 128 and dq_kwargs["BLOCK_M"] == 128
    delta = dq_named["Delta"]
    named = dict(zip(bwd_hopper.flash_bwd_dkdv_hopper_kernel.arg_names, calls[1][1]))
    assert named["Delta"] is delta and named["dK"] is grads[1] and named["dV"] is grads[2]
    assert calls[1][2]["CAUSAL"] == causal and calls[1][2]["STAGES"] == config.num_stages


@pytest.mark.parametrize("dlse", [False, True], ids=["plain", "dlse"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_d256_backward_runs_dq_then_one_warpgroup_per_gradient(monkeypatch, causal, dlse):
    """D=256 (configs.HopperBwdConfig.split_gradients): the Gluon dQ kernel writes delta, then the dK/dV kernel of
    kernels/hopper/bwd_split.py reads it, 64 keys a program, GQA groups walked inside; with an LSE gradient a
    preprocess launch writes delta − dLSE first and the dQ kernel reads it (DELTA_IN) instead of computing delta."""
    from flashtile.kernels.hopper import bwd as bwd_hopper
    from flashtile.kernels.hopper import bwd_dq as bwd_dq_hopper
    from flashtile.kernels.hopper import bwd_split as bwd_split_hopper
    from flashtile.kernels.portable import bwd
    calls = []

    preprocessed = []

    def preprocess(*args, **kwargs):
        calls.append(("preprocess", args, kwargs))
        preprocessed.append(torch.zeros(args[2].shape))
        return preprocessed[-1]
    monkeypatch.setattr(bwd, "launch_preprocess", preprocess)
    monkeypatch.setattr(bwd_dq_hopper, "flash_bwd_dq_hopper_kernel",
                        _Recorder("dq", bwd_dq_hopper.flash_bwd_dq_hopper_kernel, calls))
    monkeypatch.setattr(bwd_split_hopper, "flash_bwd_dkdv_split_kernel",
                        _Recorder("split", bwd_split_hopper.flash_bwd_dkdv_split_kernel, calls))
    monkeypatch.setattr(bwd_hopper, "flash_bwd_dkdv_hopper_kernel",
                        _Recorder("paired", bwd_hopper.flash_bwd_dkdv_hopper_kernel, calls))
    q, dout, out = (torch.randn(2, 300, 8, 256, dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(2, 300, 2, 256, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(2, 8, 300)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    dlse_t = torch.randn(2, 8, 300) if dlse else None
    bwd_hopper.launch_bwd_hopper(dout, q, k, v, out, lse, *grads, 0.1, causal, True, dlse=dlse_t)
    assert [c[0] for c in calls] == (["preprocess"] if dlse else []) + ["dq", "split"]
    config = configs.BWD_HOPPER[(256, causal)]
    dq_named = dict(zip(bwd_dq_hopper.flash_bwd_dq_hopper_kernel.arg_names, calls[-2][1]))
    assert calls[-2][2]["DELTA_IN"] == dlse and calls[-2][2]["BLOCK_N"] == config.dq_hopper.block_n
    named = dict(zip(bwd_split_hopper.flash_bwd_dkdv_split_kernel.arg_names, calls[-1][1]))
    assert named["Delta"] is dq_named["Delta"] and named["dK"] is grads[1] and named["dV"] is grads[2]
    if dlse:  # the preprocess launch subtracts dLSE itself; its delta is what the kernels read
        assert calls[0][2]["dlse"] is dlse_t and named["Delta"] is preprocessed[0]
    assert named["group"] == 4 and named["nheads_k"] == 2 and named["seqlen_k"] == 300
    assert calls[-1][2]["CAUSAL"] == causal and calls[-1][2]["BLOCK_N"] == config.block_n == 64


def test_hopper_backward_configs_can_run_deterministically():
    """Every sm90 backward config can run deterministic=True (two kernels, the Gluon dQ kernel first); one pass and
    one warpgroup per gradient exclude each other."""
    for config in configs.BWD_HOPPER.values():
        assert isinstance(config.dq_hopper, configs.HopperDqConfig)
        assert not (config.single_pass and config.split_gradients)
        assert config.design(deterministic=True) != "one pass"  # bitwise reproducible: no reduce-add into dQ
    assert configs.BWD_HOPPER[(256, False)].design() == "split gradients"
    assert configs.BWD_HOPPER[(128, False)].design() == "one pass"
    with pytest.raises(ValueError, match="split_gradients"):
        configs.HopperBwdConfig(dq_hopper=configs.HopperDqConfig(), single_pass=True, split_gradients=True)
    with pytest.raises(ValueError, match="block_m=96"):
        configs.HopperBwdConfig(dq_hopper=configs.HopperDqConfig(), single_pass=True, block_m=96)


def test_launch_arguments_with_three_consumer_warpgroups():
    """D=64's config: 192-row Q tiles, read 64 rows per consumer; 16 warps enter with at most 128 registers
    (16 x 32 x 128 = the 64K-register file) and the consumers ask for 160."""
    cfg = configs.FWD_HOPPER[(64, False)]
    assert cfg.block_m == 192 and cfg.block_m // 64 == 3
    assert 16 * 32 * cfg.maxnreg <= 65536 and 128 * (3 * cfg.consumer_regs + 24) <= 65536
    batch, seqlen, nheads = 2, 1000, 4
    q, k, v = (torch.randn(batch, seqlen, nheads, 64, dtype=torch.bfloat16) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(batch, nheads, seqlen)
    grid, args, kwargs = fwd_launch.launch_args(q, k, v, out, lse, None, None, None, 0.125, False, True, cfg)
    named = dict(zip(fwd_hopper.flash_fwd_hopper_kernel.arg_names, args))
    assert named["n_m"] == 6 and named["n_bh"] == batch * nheads  # 1000 rows: 6 tiles of 192
    assert kwargs["SWITCHES"].SCHEDULE == 2 and grid == (min(6 * batch * nheads, num_sms(q.device)), )  # single tiles
    assert args[0].block_shape == [64, 64]
    assert (kwargs["BLOCK_M"], kwargs["REGS"], kwargs["maxnreg"], kwargs["num_warps"]) == (192, 160, 128, 4)


def test_schedule_model_takes_every_tile_once():
    """tools/fwd_schedule_model.py (the grid model behind docs/perf/forward.md v29) replicates the kernel's
    _item: each of its orders takes every (head, Q tile) exactly once, for lengths 1-1,300 and grids of 1-132."""
    sys.path.insert(0, str(ROOT / "tools"))
    import fwd_schedule_model
    fwd_schedule_model.check_bijection()
    assert fwd_schedule_model.busiest(2048, 256, 192, False, 2) < fwd_schedule_model.busiest(2048, 256, 192, False, 0)


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_single_pass_backward_launches(monkeypatch, causal, deterministic):
    """configs.HopperBwdConfig.single_pass: delta and a zeroed float32 dQ (head-major, whole Q tiles) by one launch,
    then the dK/dV kernel handing dS·K to the copy engine's reduce into that dQ, then dQ cast into the caller's
    tensor; deterministic=True keeps the two kernels without atomics."""
    from flashtile.kernels.hopper import bwd as bwd_hopper
    from flashtile.kernels.hopper import bwd_dq as bwd_dq_hopper
    from flashtile.kernels.portable import bwd
    calls = []

    def preprocess(*args, **kwargs):
        calls.append(("preprocess", args, kwargs))
        return torch.zeros(args[2].shape), torch.zeros(kwargs["zeroed"])
    monkeypatch.setattr(bwd, "launch_preprocess", preprocess)
    monkeypatch.setattr(bwd, "launch_dq_cast", lambda *args: calls.append(("cast", args, {})))
    monkeypatch.setattr(bwd, "launch_bwd", lambda *args, **kwargs: calls.append(("dq", args, kwargs)))
    monkeypatch.setattr(bwd_hopper, "flash_bwd_dkdv_hopper_kernel",
                        _Recorder("dkdv", bwd_hopper.flash_bwd_dkdv_hopper_kernel, calls))
    monkeypatch.setattr(bwd_dq_hopper, "flash_bwd_dq_hopper_kernel",
                        _Recorder("dq", bwd_dq_hopper.flash_bwd_dq_hopper_kernel, calls))
    table = {key: c if c.split_gradients else dataclasses.replace(c, single_pass=True)
             for key, c in configs.BWD_HOPPER.items()}
    monkeypatch.setattr(configs, "BWD_HOPPER", table)
    q, dout, out = (torch.randn(2, 200, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(2, 256, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(2, 4, 200)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    bwd_hopper.launch_bwd_hopper(dout, q, k, v, out, lse, *grads, 0.1, causal, True, deterministic)
    if deterministic:
        assert [c[0] for c in calls] == ["dq", "dkdv"]
        assert not calls[1][2]["DQ_REDUCE"]
        return
    assert [c[0] for c in calls] == ["preprocess", "dkdv", "cast"]
    block_m = table[(128, causal)].block_m
    assert calls[0][2]["zeroed"] == (2, 4, -(-200 // block_m) * block_m, 128)
    named = dict(zip(bwd_hopper.flash_bwd_dkdv_hopper_kernel.arg_names, calls[1][1]))
    dq_acc = calls[2][1][0]  # what the cast reads: the preprocess's zeroed tensor
    assert calls[1][2]["DQ_REDUCE"] and dq_acc.shape == calls[0][2]["zeroed"]
    desc = named["dQacc"]  # the reduce's view of it: rows of 32 floats, a [128, 32] box per warpgroup and step
    assert desc.base.data_ptr() == dq_acc.data_ptr() and desc.shape == [dq_acc.numel() // 32, 32]
    assert desc.block_shape == [128, 32]
    assert named["stride_dqb"] == dq_acc.stride(0) // 32 and named["stride_dqh"] == dq_acc.stride(1) // 32
    assert calls[2][1][1] is grads[0] and calls[2][1][2] == 0.1
