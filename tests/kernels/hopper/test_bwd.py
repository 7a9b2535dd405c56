"""The sm90 backward (kernels/hopper/bwd.py, bwd_dq.py, bwd_split.py). On any machine: its launch arguments, the
order of its launches and its dispatch. GPU tier (`pytest -m gpu`): gradients at real sizes in both designs, CUDA
graphs, the deterministic flag, the LSE's gradient."""
import dataclasses
import math

import pytest
import torch
from bwd_checks import assert_grads_close, assert_graph_replays_like_eager, check, check_sinks, gradients
from helpers import DTYPE_IDS, poisoned_outputs, randn, torch_attention

import flashtile
from flashtile import checks, configs, dispatch, reference
from flashtile.kernels.hopper.common import GLUON_VERSION_OK


def test_backward_launch_arguments():
    """kernels/hopper/bwd.py: a program per 128-key tile and (batch, KV head); Q, dO read as
    64-row tiles and K, V as the consumers' 64-key halves; the causal diagonal from the alignment."""
    from flashtile.kernels.hopper import bwd as bwd_hopper
    q = torch.randn(2, 300, 8, 128, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 500, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(2, 8, 300)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for bottom_right, diag in ((True, 200), (False, 0)):
        grid, args, kwargs = bwd_hopper.launch_args(q, k, v, q, dk, dv, lse, lse, 0.1, (-1, 0), bottom_right)
        assert grid == (4, 2, 2)  # (K/V tiles, KV heads, batch)
        assert [d.block_shape for d in args[:4]] == [[64, 128], [64, 128], [64, 128], [64, 128]]
        names = bwd_hopper.flash_bwd_dkdv_hopper_kernel.arg_names
        values = dict(zip(names, args))
        assert (values["seqlen_q"], values["seqlen_k"], values["diag"], values["group"]) == (300, 500, diag, 4)
        assert (values["q_rows_b"], values["q_col_h"], values["k_rows_b"], values["k_col_h"]) == (300, 128, 500, 128)
        assert values["qk_scale"] == pytest.approx(0.1 * math.log2(math.e))  # dK's scale: qk_scale · ln 2
        assert kwargs["SWITCHES"].MASK_RIGHT and kwargs["BLOCK_N"] == 128 and kwargs["BLOCK_M"] == 64


def test_padded_head_dim_launch_arguments():
    """D=96 runs in tiles of 128 columns (the kernels derive HEAD_DIM_PAD from HEAD_DIM): Q, K, V, dO read through
    3-D (rows, heads, head dim) views in [rows, 1, 128] boxes, a head's coordinate its index; dQacc 128 columns
    wide."""
    from flashtile.kernels.hopper import bwd as bwd_hopper
    from flashtile.kernels.hopper import bwd_dq, bwd_split
    q = torch.randn(2, 300, 8, 96, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 500, 2, 96, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(2, 8, 300)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    config = configs.BWD_HOPPER[(128, True)]
    dq_acc = torch.empty(bwd_hopper.dq_acc_shape(q, config))
    assert dq_acc.shape == (2, 8, 320, 128)
    grid, args, kwargs = bwd_hopper.launch_args(q, k, v, q, dk, dv, lse, lse, 0.1, (-1, 0), True, config, dq_acc)
    assert [d.block_shape for d in args[:4]] == [[64, 1, 128]] * 4
    assert [tuple(d.base.shape) for d in args[:4]] == [(600, 8, 96), (1000, 2, 96), (1000, 2, 96), (600, 8, 96)]
    values = dict(zip(bwd_hopper.flash_bwd_dkdv_hopper_kernel.arg_names, args))
    assert (values["q_rows_b"], values["q_col_h"], values["k_rows_b"], values["k_col_h"]) == (300, 1, 500, 1)
    assert kwargs["HEAD_DIM"] == 96
    assert values["dQacc"].block_shape == [128, 32]
    for launch_args in (bwd_dq.launch_args(q, k, v, q, q, q, lse, lse, 0.1, (-1, 0), True, config.dq_hopper)[2],
                        bwd_split.launch_args(q, k, v, q, dk, dv, lse, lse, 0.1, (-1, 0), True,
                                              configs.BWD_HOPPER[(256, True)])[2]):
        assert launch_args["HEAD_DIM"] == 96


def test_window_launch_arguments():
    """A sliding window (left, right), bottom-right aligned: query i sees keys i + diag_left .. i + diag, diag the
    offset seqlen_k − seqlen_q plus right, diag_left that offset minus left, each side masked only where it is
    bounded (BwdSwitches), in all three backward kernels; (-1, 0) is causal's, (-1, -1) masks nothing."""
    from flashtile.kernels.hopper import bwd as bwd_hopper
    from flashtile.kernels.hopper import bwd_dq, bwd_split
    q = torch.randn(2, 300, 8, 128, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 500, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(2, 8, 300)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    cases = {(100, 50): (True, True, 250, 100), (-1, 0): (True, False, 200, 200), (-1, -1): (False, False, 200, 200),
             (128, -1): (False, True, 200, 72)}
    assert bwd_dq.band((100, 50), 300, 500, False) == (True, True, 50, -100)
    for window, (right, left, diag, diag_left) in cases.items():
        assert bwd_dq.band(window, 300, 500, True) == (right, left, diag, diag_left)
        for make, kernel in ((lambda: bwd_hopper.launch_args(q, k, v, q, dk, dv, lse, lse, 0.1, window, True),
                              bwd_hopper.flash_bwd_dkdv_hopper_kernel),
                             (lambda: bwd_dq.launch_args(q, k, v, q, q, q, lse, lse, 0.1, window, True,
                                                         configs.HopperDqConfig()),
                              bwd_dq.flash_bwd_dq_hopper_kernel),
                             (lambda: bwd_split.launch_args(q, k, v, q, dk, dv, lse, lse, 0.1, window, True,
                                                            configs.BWD_HOPPER[(256, False)]),
                              bwd_split.flash_bwd_dkdv_split_kernel)):
            _, args, kwargs = make()
            values = dict(zip(kernel.arg_names, args))
            assert (values["diag"], values["diag_left"]) == (diag, diag_left), (window, kernel)
            assert (kwargs["SWITCHES"].MASK_RIGHT, kwargs["SWITCHES"].MASK_LEFT) == (right, left), (window, kernel)


def test_packed_launch_arguments():
    """Packed sequences (3-D q, k, v): the grid covers the longest sequence's keys for every (sequence, KV head); the
    kernel takes cu_seqlens, the longest lengths (it bounds each sequence's by them), the bottom-right flag as diag
    (with a window: each side's offset from a sequence's diagonal, a side open to the left one past every row), no
    batch strides (dK, dV, the (nheads, total) LSE); dQacc has a batch entry per sequence."""
    from flashtile.kernels.hopper import bwd as bwd_hopper
    q, dout = torch.randn(300, 8, 128, dtype=torch.bfloat16), torch.randn(300, 8, 128, dtype=torch.bfloat16)
    k, v = (torch.randn(500, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(8, 300)
    cu_q, cu_k = torch.tensor([0, 100, 300], dtype=torch.int32), torch.tensor([0, 260, 500], dtype=torch.int32)
    config = configs.BWD_HOPPER[(128, True)]
    packed = (cu_q, cu_k, 200, 260)
    dq_acc = torch.empty(bwd_hopper.dq_acc_shape(q, config, packed))
    assert dq_acc.shape == (2, 8, 256, 128)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    grid, args, kwargs = bwd_hopper.launch_args(q, k, v, dout, dk, dv, lse, lse, 0.1, (-1, 0), True, config, dq_acc,
                                                packed=packed)
    values = dict(zip(bwd_hopper.flash_bwd_dkdv_hopper_kernel.arg_names, args))
    assert grid == (3, 2, 2) and kwargs["SWITCHES"].IS_VARLEN and kwargs["SWITCHES"].DQ_REDUCE
    assert (values["seqlen_q"], values["seqlen_k"], values["diag"]) == (200, 260, 1)
    assert values["cu_seqlens_q"] is cu_q and values["cu_seqlens_k"] is cu_k
    assert (values["stride_dkb"], values["stride_dkn"], values["stride_dkh"]) == (0, 256, 128)
    assert (values["stride_lb"], values["stride_lh"]) == (0, 300)
    assert values["q_rows_b"] == values["q_rows_h"] == 0 and values["q_col_h"] == 128
    cases = {(100, 50): (True, True, 50, -100), (128, -1): (False, True, 0, -128), (-1, 64): (True, True, 64, -500),
             (0, 0): (True, True, 0, 0)}
    for window, (right, left, diag, diag_left) in cases.items():  # each side's offset from each sequence's diagonal
        for bottom_right in (True, False):
            _, args, kwargs = bwd_hopper.launch_args(q, k, v, dout, dk, dv, lse, lse, 0.1, window, bottom_right, config,
                                                     dq_acc, packed=packed)
            values = dict(zip(bwd_hopper.flash_bwd_dkdv_hopper_kernel.arg_names, args))
            sw = kwargs["SWITCHES"]
            assert (sw.MASK_RIGHT, sw.MASK_LEFT, values["diag"], values["diag_left"]) == (right, left, diag, diag_left)
            assert sw.IS_VARLEN and sw.BOTTOM_RIGHT == bottom_right
    with pytest.raises(ValueError, match="packed sequences take the one pass"):
        bwd_hopper.launch_bwd_hopper(dout, q, k, v, q, lse, q, dk, dv, 0.1, (-1, 0), True, deterministic=True,
                                     config=config, packed=packed)


def test_packed_split_launch_arguments():
    """Packed sequences on the split design: the dQ kernel's grid over the longest sequence's Q tiles for every
    (sequence, head), the dK/dV kernel's over its K/V tiles for every (sequence, KV head); both take cu_seqlens, the
    longest lengths, no batch strides ((nheads, total) LSE and delta, packed O, dQ, dK, dV) and the packed band."""
    from flashtile.kernels.hopper import bwd_dq, bwd_split
    q, dout = torch.randn(300, 8, 256, dtype=torch.bfloat16), torch.randn(300, 8, 256, dtype=torch.bfloat16)
    k, v = (torch.randn(500, 2, 256, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(8, 300)
    cu_q, cu_k = torch.tensor([0, 100, 300], dtype=torch.int32), torch.tensor([0, 260, 500], dtype=torch.int32)
    config = configs.BWD_HOPPER[(256, True)]
    assert config.split_gradients
    packed = (cu_q, cu_k, 200, 260)
    grid, args, kwargs = bwd_dq.launch_args(q, k, v, q, dout, q, lse, lse, 0.1, (-1, 0), True, config.dq_hopper,
                                            packed=packed)
    values = dict(zip(bwd_dq.flash_bwd_dq_hopper_kernel.arg_names, args))
    assert grid == (-(-200 // config.dq_hopper.block_m), 2 * 8) and kwargs["SWITCHES"].IS_VARLEN
    assert (values["seqlen_q"], values["seqlen_k"], values["diag"]) == (200, 260, 1)
    assert values["cu_seqlens_q"] is cu_q
    assert (values["stride_ob"], values["stride_dqb"], values["stride_lb"]) == (0, 0, 0)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    grid, args, kwargs = bwd_split.launch_args(q, k, v, dout, dk, dv, lse, lse, 0.1, (128, 0), True, config,
                                               packed=packed)
    values = dict(zip(bwd_split.flash_bwd_dkdv_split_kernel.arg_names, args))
    sw = kwargs["SWITCHES"]
    assert grid == (-(-260 // config.block_n), 2 * 2) and sw.IS_VARLEN and sw.MASK_LEFT and sw.MASK_RIGHT
    assert (values["diag"], values["diag_left"]) == (0, -128)  # offsets from each sequence's diagonal
    assert (values["stride_dkb"], values["stride_dvb"], values["stride_lb"]) == (0, 0, 0)
    assert values["cu_seqlens_k"] is cu_k


def test_backward_dispatch(monkeypatch):
    """On sm90 (pretended here) "auto" gives D=64, 128 and 256 batch-mode calls to the Gluon backward at any length,
    with any window, and head dims of 16-byte rows in tiles of those (40, 80, 96, 192) with their tiles' configs;
    "portable" never; packed sequences where the design is the one pass (D=64, 128, not deterministic) or splits the
    gradients (D=192, 256), any window;
    other head dims (rows not of 16 bytes, tiles of 32 columns) stay portable."""
    monkeypatch.setattr(dispatch, "arch", lambda device: (9, 0))
    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)
    ok = GLUON_VERSION_OK

    def taken(backend, seqlen_k, head_dim=128, window=(-1, 0), packed=False, deterministic=False):
        monkeypatch.setattr(configs, "BWD_BACKEND", backend)
        q = torch.randn(1, 64, 4, head_dim, dtype=torch.bfloat16)
        k = torch.randn(1, seqlen_k, 2, head_dim, dtype=torch.bfloat16)
        tensors = [t.flatten(0, 1) for t in (q, k, k, q)] if packed else (q, k, k, q)
        return dispatch.backward(*tensors, window, packed, deterministic).kernel == "hopper/bwd.py"

    assert {d for d, _ in configs.BWD_HOPPER} == {64, 128, 256}
    for (head_dim, causal), config in configs.BWD_HOPPER.items():
        window = (-1, 0) if causal else (-1, -1)
        assert taken("auto", 1, head_dim, window) == taken("auto", 4096, head_dim, window) == ok
    assert not taken("portable", 4096)
    for head_dim in (40, 80, 96, 192):
        assert taken("auto", 4096, head_dim) == taken("auto", 4096, head_dim, (-1, -1)) == ok
    assert not taken("auto", 4096, head_dim=59) and not taken("auto", 4096, head_dim=24)
    assert taken("auto", 4096, head_dim=96, packed=True) == taken("auto", 4096, head_dim=192, packed=True) == ok
    for window in ((256, 0), (100, 100), (128, -1), (-1, 64)):
        assert taken("auto", 4096, window=window) == taken("auto", 4096, 256, window) == ok
        assert taken("auto", 4096, window=window, packed=True) == ok
    assert taken("auto", 4096, packed=True) == taken("auto", 4096, head_dim=64, packed=True) == ok
    assert not taken("auto", 4096, packed=True, deterministic=True)  # (no packed two kernels at D=64, 128)
    assert taken("auto", 4096, head_dim=256, packed=True) == taken("auto", 4096, 256, packed=True,
                                                                   deterministic=True) == ok  # the split design


def test_softcap_takes_the_entries_of_bwd_hopper_softcap(monkeypatch):
    """softcap on sm90 (pretended): every head dim configs.BWD_HOPPER_SOFTCAP has (64 to 256, 192 in 256's tiles)
    takes the sm90 backward with that entry (D=64 in 64-row steps), deterministic too; ALiBi the portable one, and so
    does a head dim whose entry is taken out."""
    monkeypatch.setattr(dispatch, "arch", lambda device: (9, 0))
    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)
    for head_dim in (256, 192, 128, 64):
        q = torch.randn(1, 64, 4, head_dim, dtype=torch.bfloat16)
        for window in ((-1, -1), (-1, 0), (256, 0)):
            for deterministic in (False, True):
                plan = dispatch.backward(q, q, q, q, window, False, deterministic, softcap=30.0)
                if not GLUON_VERSION_OK:
                    assert plan.kernel == "portable/bwd.py"
                    continue
                key = (256 if head_dim == 192 else head_dim, dispatch.is_causal(window))
                assert plan.kernel == "hopper/bwd.py" and plan.config is configs.BWD_HOPPER_SOFTCAP[key], key
        assert dispatch.backward(q, q, q, q, (-1, 0), alibi_slopes=torch.ones(4)).kernel == "portable/bwd.py"
    assert configs.BWD_HOPPER_SOFTCAP[(64, False)].block_m == 64
    monkeypatch.delitem(configs.BWD_HOPPER_SOFTCAP, (128, True))
    q = torch.randn(1, 64, 4, 128, dtype=torch.bfloat16)
    assert dispatch.backward(q, q, q, q, (-1, 0), softcap=30.0).kernel == "portable/bwd.py"
    assert dispatch.backward(q, q, q, q, (-1, -1), softcap=30.0).kernel == ("hopper/bwd.py" if GLUON_VERSION_OK
                                                                             else "portable/bwd.py")


@pytest.mark.skipif(not GLUON_VERSION_OK, reason="the Gluon kernels are written for triton 3.6")
def test_supports_reads_do_like_q_and_v_like_k():
    """bwd.supports: the loader reads dO at Q's coordinates and V at K's, so each pair must share its 2-D view (token-
    or head-major alike); every base 16-byte aligned."""
    from flashtile.kernels.hopper import bwd as bwd_hopper
    q, dout = (torch.randn(2, 64, 4, 128, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 96, 2, 128, dtype=torch.bfloat16) for _ in range(2))

    def head_major(t):
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    assert bwd_hopper.supports(q, k, v, dout, (-1, 0))
    assert bwd_hopper.supports(head_major(q), k, v, head_major(dout), (-1, -1))  # each pair in its own layout
    assert not bwd_hopper.supports(q, k, v, head_major(dout), (-1, 0))
    assert not bwd_hopper.supports(q, k, head_major(v), dout, (-1, 0))
    assert not bwd_hopper.supports(q, k[..., :64], v[..., :64], dout, (-1, 0))  # rows of 64 columns in a 128 stride
    unaligned = torch.randn(2 * 64 * 4 * 128 + 1, dtype=torch.bfloat16)[1:].view(2, 64, 4, 128)
    assert not bwd_hopper.supports(q, k, v, unaligned, (-1, 0))
    assert bwd_hopper.supports(q, k, v, dout, (128, 0))  # a sliding window, batch mode and packed
    assert bwd_hopper.supports(*(t.flatten(0, 1) for t in (q, k, v, dout)), (128, 0))
    packed = torch.randn(2, 64, 3, 4, 128, dtype=torch.bfloat16)  # flash_attn_qkvpacked_func's, or a fused projection's
    assert bwd_hopper.supports(*packed.unbind(2), dout, (-1, 0))


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
    bwd_hopper.launch_bwd_hopper(dout, q, k, v, out, lse, *grads, 0.1, checks.window((-1, -1), causal), True)
    assert [c[0] for c in calls] == ["dq", "dkdv"]
    _, dq_args, dq_kwargs = calls[0]
    config = table[(128, causal)]
    dq_named = dict(zip(bwd_dq_hopper.flash_bwd_dq_hopper_kernel.arg_names, dq_args))
    assert dq_named["dQ"] is grads[0] and dq_named["O"] is out and dq_named["LSE"] is lse
    assert dq_kwargs["SWITCHES"].MASK_RIGHT == causal and dq_kwargs["BLOCK_N"] == 128 and dq_kwargs["BLOCK_M"] == 128
    delta = dq_named["Delta"]
    named = dict(zip(bwd_hopper.flash_bwd_dkdv_hopper_kernel.arg_names, calls[1][1]))
    assert named["Delta"] is delta and named["dK"] is grads[1] and named["dV"] is grads[2]
    assert calls[1][2]["SWITCHES"].MASK_RIGHT == causal and calls[1][2]["STAGES"] == config.num_stages


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
        return preprocessed[-1], None, None
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
    bwd_hopper.launch_bwd_hopper(dout, q, k, v, out, lse, *grads, 0.1, checks.window((-1, -1), causal), True,
                                 dlse=dlse_t)
    assert [c[0] for c in calls] == (["preprocess"] if dlse else []) + ["dq", "split"]
    config = configs.BWD_HOPPER[(256, causal)]
    dq_named = dict(zip(bwd_dq_hopper.flash_bwd_dq_hopper_kernel.arg_names, calls[-2][1]))
    assert calls[-2][2]["SWITCHES"].DELTA_IN == dlse and calls[-2][2]["BLOCK_N"] == config.dq_hopper.block_n
    named = dict(zip(bwd_split_hopper.flash_bwd_dkdv_split_kernel.arg_names, calls[-1][1]))
    assert named["Delta"] is dq_named["Delta"] and named["dK"] is grads[1] and named["dV"] is grads[2]
    if dlse:  # the preprocess launch subtracts dLSE itself; its delta is what the kernels read
        assert calls[0][2]["dlse"] is dlse_t and named["Delta"] is preprocessed[0]
    assert named["group"] == 4 and named["nheads_k"] == 2 and named["seqlen_k"] == 300
    assert calls[-1][2]["SWITCHES"].MASK_RIGHT == causal and calls[-1][2]["BLOCK_N"] == config.block_n == 64


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
        return torch.zeros(args[2].shape), torch.zeros(kwargs["zeroed"]), None
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
    bwd_hopper.launch_bwd_hopper(dout, q, k, v, out, lse, *grads, 0.1, checks.window((-1, -1), causal), True,
                                 deterministic)
    if deterministic:
        assert [c[0] for c in calls] == ["dq", "dkdv"]
        assert not calls[1][2]["SWITCHES"].DQ_REDUCE
        return
    assert [c[0] for c in calls] == ["preprocess", "dkdv", "cast"]
    block_m = table[(128, causal)].block_m
    assert calls[0][2]["zeroed"] == (2, 4, -(-200 // block_m) * block_m, 128)
    named = dict(zip(bwd_hopper.flash_bwd_dkdv_hopper_kernel.arg_names, calls[1][1]))
    dq_acc = calls[2][1][0]  # what the cast reads: the preprocess's zeroed tensor
    assert calls[1][2]["SWITCHES"].DQ_REDUCE and dq_acc.shape == calls[0][2]["zeroed"]
    desc = named["dQacc"]  # the reduce's view of it: rows of 32 floats, a [128, 32] box per warpgroup and step
    assert desc.base.data_ptr() == dq_acc.data_ptr() and desc.shape == [dq_acc.numel() // 32, 32]
    assert desc.block_shape == [128, 32]
    assert named["stride_dqb"] == dq_acc.stride(0) // 32 and named["stride_dqh"] == dq_acc.stride(1) // 32
    assert calls[2][1][1] is grads[0] and calls[2][1][2] == 0.1


@pytest.mark.parametrize("softcap", [0.0, 30.0], ids=["plain", "softcap"])
def test_launch_without_a_config_takes_dispatchs_table(monkeypatch, softcap):
    """A direct call without ``config`` (launch_bwd_hopper, launch_args) takes the entry dispatch would:
    configs.BWD_HOPPER_SOFTCAP's for a capped call (D=64 in 64-row steps), configs.BWD_HOPPER's otherwise."""
    from flashtile.kernels.hopper import bwd as bwd_hopper
    from flashtile.kernels.portable import bwd
    taken = []
    monkeypatch.setattr(bwd, "launch_preprocess", lambda *args, **kwargs: (None, None, None))
    monkeypatch.setattr(bwd, "launch_dq_cast", lambda *args: None)
    monkeypatch.setattr(bwd_hopper, "_launch_dkdv", lambda *args: taken.append(args[11]))
    q, dout, out = (torch.randn(1, 128, 2, 64, dtype=torch.bfloat16) for _ in range(3))
    bwd_hopper.launch_bwd_hopper(dout, q, q, q, out, torch.randn(1, 2, 128), *(torch.empty_like(q) for _ in range(3)),
                                 0.1, (-1, -1), True, softcap=softcap)
    table = configs.BWD_HOPPER_SOFTCAP if softcap else configs.BWD_HOPPER
    assert taken == [table[(64, False)]] and taken[0].block_m == (64 if softcap else 128)
    _, _, kwargs = bwd_hopper.launch_args(q, q, q, q, q, q, torch.randn(1, 2, 128), None, 0.1, (-1, -1),
                                          softcap=softcap)
    assert kwargs["BLOCK_M"] == taken[0].block_m


# GPU tier (`pytest -m gpu`): on sm90 only (hopper_backward), against the float64 reference beside PyTorch's own
# error.
@pytest.fixture
def hopper_backward(monkeypatch):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the kernel is for sm90")
    monkeypatch.setattr(configs, "BWD_BACKEND", "auto")


def _with_single_pass(single):
    """configs.BWD_HOPPER with the D=64 and D=128 entries in one pass or two kernels (D=256 has two kernels only)."""
    return {key: c if c.split_gradients else dataclasses.replace(c, single_pass=single)
            for key, c in configs.BWD_HOPPER.items()}


@pytest.fixture(params=["single-pass", "two-kernels"])
def bwd_path(request, monkeypatch):
    """Either design of the sm90 backward at D=64 and D=128 (configs.HopperBwdConfig.single_pass)."""
    monkeypatch.setattr(configs, "BWD_HOPPER", _with_single_pass(request.param == "single-pass"))
    return request.param


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
def test_taken_for_the_shapes_it_covers():
    for d in (64, 128, 256):
        q, k = randn(1, 256, 4, d, dtype=torch.bfloat16), randn(1, 256, 2, d, dtype=torch.bfloat16)
        assert dispatch.backward(q, k, k, q, (-1, -1), False).kernel == "hopper/bwd.py"
        assert dispatch.backward(q, k, k, q, (-1, 0), False).kernel == "hopper/bwd.py"
        assert dispatch.backward(q, k, k, q, (128, 0), False).kernel == "hopper/bwd.py"  # sliding window
    d60 = (t[..., :60].contiguous() for t in (q, k, k, q))  # rows of 120 bytes
    assert dispatch.backward(*d60, (-1, -1), False).kernel == "portable/bwd.py"


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256], ids=lambda d: f"d{d}")
def test_packed_qkv_read_in_place(head_dim, causal):
    """flash_attn_qkvpacked_func's qkv (batch, seqlen, 3, nheads, headdim), whose q, k, v rows are 3 · nheads · headdim
    apart: the sm90 forward and backward read them where they lie, O and dqkv against float64 within 2x of PyTorch's
    own error."""
    qkv = randn(2, 2048, 3, 8, head_dim, dtype=torch.bfloat16)  # (D=64 takes the sm90 forward from 2048 rows causal)
    dout = randn(2, 2048, 8, head_dim, dtype=torch.bfloat16)
    window = (-1, 0) if causal else (-1, -1)
    assert dispatch.forward(*qkv.unbind(2), window).kernel == "hopper/fwd.py"
    assert dispatch.backward(*qkv.unbind(2), dout, window, False).kernel == "hopper/bwd.py"
    ours = gradients(lambda qkv: flashtile.flash_attn_qkvpacked_func(qkv, causal=causal), (qkv, ), dout)
    ref = gradients(lambda qkv: reference.attention(*qkv.unbind(2), causal=causal)[0], (qkv, ), dout.double())
    base = gradients(lambda qkv: torch_attention(*qkv.unbind(2), causal, window), (qkv, ), dout)
    assert_grads_close(ours, ref, base)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (256, 0), (100, 100), (-1, 64), (64, -1)],
                         ids=["full", "causal", "w256_0", "w100_100", "w-1_64", "w64_-1"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256], ids=lambda d: f"d{d}")
def test_packed_sequences(head_dim, window, dtype):
    """flash_attn_varlen_func's gradients on the sm90 one pass (D=192, 256: the split design's two kernels): ragged
    sequences (one without queries, one without
    keys, Nq ≠ Nk, longer than a tile or shorter), GQA 4/2, rows past the last sequence in q, k and v; full, causal
    and sliding windows (each sequence's band from its own diagonal); against float64 within 2x of PyTorch's own
    error, and the rows past the last sequence's gradients zero."""
    from helpers import torch_attention_varlen, varlen_inputs
    seqlens_q, seqlens_k = [5, 0, 700, 333, 1, 1024], [9, 12, 700, 1300, 0, 1024]
    q, k, v, cu_q, cu_k = varlen_inputs(seqlens_q, seqlens_k, 4, 2, head_dim, dtype)
    q_pad = torch.cat([q, randn(19, 4, head_dim, dtype=dtype)])
    k_pad, v_pad = (torch.cat([t, randn(13, 2, head_dim, dtype=dtype)]) for t in (k, v))
    dout = randn(*q_pad.shape, dtype=dtype)
    packed = [t.detach() for t in (q_pad, k_pad, v_pad, dout)]
    assert dispatch.backward(*packed, window, True).kernel == "hopper/bwd.py"
    with poisoned_outputs():
        out, dq, dk, dv = gradients(lambda q, k, v: flashtile.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, 1024, 1300, window_size=window), (q_pad, k_pad, v_pad), dout)
    rows, keys = q.shape[0], k.shape[0]
    for grad, used in ((dq, rows), (dk, keys), (dv, keys)):
        assert torch.equal(grad[used:], torch.zeros_like(grad[used:]))
    ref = gradients(lambda q, k, v: reference.attention_varlen(q, k, v, cu_q, cu_k, window_size=window)[0],
                    (q, k, v), dout[:rows].double())
    base = gradients(lambda q, k, v: torch_attention_varlen(q, k, v, cu_q, cu_k, False, window), (q, k, v),
                     dout[:rows])
    assert_grads_close((out[:rows], dq[:rows], dk[:keys], dv[:keys]), ref, base)


SHAPES = [(1, 1024, 1024, 2, 2), (2, 1000, 3001, 8, 2), (2, 3001, 1000, 4, 4), (1, 4096, 4096, 4, 1),
          (3, 17, 113, 2, 1)]


def shape_id(s):
    return f"b{s[0]}-q{s[1]}-k{s[2]}-h{s[3]}-hk{s[4]}"


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("head_dim", [64, 96, 128], ids=lambda d: f"d{d}")
def test_gradients(head_dim, shape, causal, dtype, bwd_path):
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    check(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("with_dlse", [False, True], ids=["no-dlse", "dlse"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
def test_gradients_into_given_tensors_and_the_delta_used(head_dim, with_dlse, bwd_path):
    """test_bwd.check_gradients_into_given_tensors on the sm90 backward (the flash_attn shim's call), each design."""
    from bwd_checks import check_gradients_into_given_tensors
    q, dout = (randn(2, 1000, 8, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 1000, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    check_gradients_into_given_tensors(q, k, v, dout, False, with_dlse, False, False)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("head_dim", [192, 256], ids=lambda d: f"d{d}")
def test_gradients_wide_heads(head_dim, shape, causal, dtype):
    """D=256 and D=192 (in its tiles): the dQ kernel, then one warpgroup per gradient (kernels/hopper/bwd_split.py)."""
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    check(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (1000, 0)], ids=["full", "causal", "w1000_0"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("deterministic", [False, True], ids=["plain", "deterministic"])
def test_softcap_gradients(head_dim, window, dtype, deterministic):
    """flash-attn's softcap (Gemma 2: 50) on the sm90 backward, both ways: dQ and dK/dV through tanh's derivative (the
    dQ kernel from each P; the split design's dK/dV kernel from the Pᵀ · (1 − tanh²) its dV warpgroup hands over, the
    one pass's (D=64, 128, and 96 in 128's tiles) from its own Pᵀ); scores past the cap, GQA, Nq != Nk; every gradient
    against float64 within 2x of PyTorch's own error, on NaN-filled outputs."""
    q = randn(2, 1500, 8, head_dim, dtype=dtype, scale=16.0)
    k, v = (randn(2, 1300, 2, head_dim, dtype=dtype) for _ in range(2))
    dout = randn(2, 1500, 8, head_dim, dtype=dtype)
    assert dispatch.backward(q, k, v, dout, window, softcap=50.0).kernel == "hopper/bwd.py"
    kwargs = dict(window_size=window, softcap=50.0)
    with poisoned_outputs():
        ours = gradients(lambda q, k, v: flashtile.flash_attn_func(q, k, v, deterministic=deterministic, **kwargs),
                         (q, k, v), dout)
    ref = gradients(lambda q, k, v: reference.attention(q, k, v, **kwargs)[0], (q, k, v), dout.double())
    base = gradients(lambda q, k, v: reference.attention(q, k, v, upcast=False, **kwargs)[0], (q, k, v), dout)
    assert_grads_close(ours, ref, base)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (256, 0)], ids=["full", "causal", "w256_0"])
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256], ids=lambda d: f"d{d}")
def test_softcap_on_packed_sequences(head_dim, window):
    """Gemma 2's padding-free batches: softcap on packed ragged sequences (one without queries, Nq != Nk, longer
    than a tile or shorter), GQA 4/2, rows past the last sequence in q, on the one pass (D=64, 128) and the split
    design (D=192, 256); every gradient against float64 within 2x of PyTorch's own error, and those rows' dQ zero."""
    from helpers import varlen_inputs
    seqlens_q, seqlens_k = [5, 0, 700, 333, 1024], [9, 12, 700, 1300, 1024]
    q, k, v, cu_q, cu_k = varlen_inputs(seqlens_q, seqlens_k, 4, 2, head_dim, torch.bfloat16)
    q_pad = torch.cat([q, randn(19, 4, head_dim, dtype=q.dtype)])
    dout = randn(*q_pad.shape, dtype=q.dtype)
    packed = [t.detach() for t in (q_pad, k, v, dout)]
    assert dispatch.backward(*packed, window, True, softcap=50.0).kernel == "hopper/bwd.py"
    with poisoned_outputs():
        out, dq, dk, dv = gradients(lambda q, k, v: flashtile.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, 1024, 1300, window_size=window, softcap=50.0), (q_pad, k, v), dout)
    rows = q.shape[0]
    assert torch.equal(dq[rows:], torch.zeros_like(dq[rows:]))
    cq, ck = cu_q.tolist(), cu_k.tolist()

    def per_sequence(upcast):
        return lambda q, k, v: torch.cat([reference.attention(
            q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]], window_size=window,
            softcap=50.0, upcast=upcast)[0][0] for b in range(len(cq) - 1) if cq[b + 1] > cq[b]])

    ref = gradients(per_sequence(True), (q, k, v), dout[:rows].double())
    base = gradients(per_sequence(False), (q, k, v), dout[:rows])
    assert_grads_close((out[:rows], dq[:rows], dk, dv), ref, base)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("deterministic", [False, True], ids=["plain", "deterministic"])
@pytest.mark.parametrize("window", [(128, 0), (1000, 0)], ids=["w128_0", "w1000_0"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
def test_sinks_under_a_window(head_dim, window, deterministic):
    """gpt-oss's layers: learnable sinks with a 128-key causal window (the forward on the portable kernel at so narrow
    a window, configs.FWD_HOPPER's min_window; D=128's sm90 forward at 1000 keys), the backward on the sm90 kernels;
    O, LSE, every gradient and the sinks' against float64 within 2x of PyTorch's own error."""
    q = randn(2, 2048, 8, head_dim, dtype=torch.bfloat16)
    assert dispatch.backward(q, q, q, q, window, deterministic=deterministic).kernel == "hopper/bwd.py"
    fwd_kernel = "hopper/fwd.py" if (head_dim, window) == (128, (1000, 0)) else "portable/fwd.py"
    assert dispatch.forward(q, q, q, window).kernel == fwd_kernel
    check_sinks(2, 2048, 2048, 8, 2, head_dim, torch.bfloat16, deterministic=deterministic, window_size=window)


WINDOWS = [(256, 0), (100, 100), (128, -1), (-1, 64), (0, 0)]


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2], SHAPES[4]], ids=shape_id)
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256], ids=lambda d: f"d{d}")
def test_window_gradients(head_dim, shape, window, bwd_path):
    """A sliding window (left, right) on the sm90 backward, either design (and the sm90 forward): a
    causal window, a symmetric one, one side only, a single key; Nq < Nk and Nq > Nk (bottom-right), GQA, ragged
    lengths; every gradient against float64 within 2x of PyTorch's own error, on NaN-filled outputs."""
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    q, k = randn(1, seqlen_q, nheads, head_dim, dtype=torch.bfloat16), randn(1, seqlen_k, nheads_k, head_dim,
                                                                              dtype=torch.bfloat16)
    assert dispatch.backward(q, k, k, q, window, False).kernel == "hopper/bwd.py"
    check(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, torch.bfloat16, window_size=window)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("head_dim", [128, 256], ids=lambda d: f"d{d}")
def test_window_deterministic(head_dim):
    """deterministic=True with a window: the two kernels, bitwise equal run to run, and right."""
    q, dout = (randn(2, 3001, 8, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 2000, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    window = (300, 0)
    runs = [gradients(lambda q, k, v: flashtile.flash_attn_func(q, k, v, window_size=window, deterministic=True),
                      (q, k, v), dout) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    ref = gradients(lambda q, k, v: reference.attention(q, k, v, window_size=window)[0], (q, k, v), dout.double())
    base = gradients(lambda q, k, v: torch_attention(q, k, v, False, window), (q, k, v), dout)
    assert_grads_close(runs[0], ref, base)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [40, 80, 96, 192], ids=lambda d: f"d{d}")
def test_padded_head_dims_in_every_layout(head_dim, causal):
    """A head dim below its tile's (40 in tiles of 64, 80 and 96 of 128, 192 of 256) on the sm90 kernels both ways,
    read where it lies: flash-attn's layout (GQA 8/2, Nq != Nk), SDPA's head-major one (fp16); O and every gradient
    against float64 within 2x of PyTorch's own error, deterministic=True too (the two kernels), on NaN-filled outputs. A
    store past the head dim would land in the next head's columns and show in its error. A packed qkv:
    test_packed_qkv_read_in_place."""
    window = (-1, 0) if causal else (-1, -1)
    q, dout = (randn(2, 1500, 8, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 1300, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    head_major = [randn(2, 4, 1100, head_dim, dtype=torch.float16).transpose(1, 2) for _ in range(4)]
    for (q, k, v), dout in [((q, k, v), dout), (head_major[:3], head_major[3])]:
        assert dispatch.forward(q, k, v, window).kernel == "hopper/fwd.py"
        assert dispatch.backward(q, k, v, dout, window).kernel == "hopper/bwd.py"
        ref = gradients(lambda q, k, v: reference.attention(q, k, v, causal=causal)[0], (q, k, v), dout.double())
        base = gradients(lambda q, k, v: torch_attention(q, k, v, causal, window), (q, k, v), dout)
        for deterministic in (False, True):
            with poisoned_outputs():
                ours = gradients(lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=causal,
                                                                           deterministic=deterministic), (q, k, v),
                                 dout)
            assert_grads_close(ours, ref, base)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
def test_forward_backward_replay_in_cuda_graph(head_dim):
    """The launches of the deterministic sm90 backward (dQ writing delta, then dK/dV) inside a captured step:
    replayed on new inputs, bitwise equal to eager (neither uses atomics)."""
    q, dout = (randn(2, 2048, 8, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 2048, 2, head_dim, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    q.requires_grad_()

    def step():
        out = flashtile.flash_attn_func(q, k, v, causal=True, deterministic=True)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    assert_graph_replays_like_eager(step, (q, k, v, dout))


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_single_pass_in_cuda_graph(causal, head_dim, monkeypatch):
    """The single-pass backward (delta and zeroed dQ, dK/dV with dQ atomics, dQ cast) captured and replayed on new
    inputs: dK, dV bitwise equal to eager, dQ within float32 reordering of it."""
    monkeypatch.setattr(configs, "BWD_HOPPER", _with_single_pass(True))
    q, dout = (randn(2, 2048, 8, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 2048, 2, head_dim, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    q.requires_grad_()

    def step():
        out = flashtile.flash_attn_func(q, k, v, causal=causal)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        for t in (q, k, v, dout):
            t.copy_(randn(*t.shape, dtype=t.dtype))
    graph.replay()
    eager = step()
    for i, (got, want) in enumerate(zip(captured, eager)):
        if i == 1:
            torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)
        else:
            assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_deterministic_is_bitwise_stable(causal, head_dim, monkeypatch):
    """With single_pass on, deterministic=True still takes the two kernels without atomics: equal run to run."""
    monkeypatch.setattr(configs, "BWD_HOPPER", _with_single_pass(True))
    q, dout = (randn(2, 3000, 8, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 3000, 2, head_dim, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    q.requires_grad_()
    runs = []
    for _ in range(3):
        out = flashtile.flash_attn_func(q, k, v, causal=causal, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), dout))
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(run, runs[0]))


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("dq_kernel", ["gluon", "gluon-128keys"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES[1:3] + SHAPES[4:], ids=shape_id)
def test_either_dq_tile(shape, causal, dq_kernel, monkeypatch):
    """The dQ half of the sm90 backward (two kernels) with either tile of the Gluon dQ kernel
    (configs.HopperBwdConfig.dq_hopper)."""
    dq_hopper = {"gluon": configs.HopperDqConfig(), "gluon-128keys": configs.HopperDqConfig(block_n=128)}[dq_kernel]
    table = {key: dataclasses.replace(c, dq_hopper=dq_hopper, single_pass=False) if key[0] == 128 else c
             for key, c in configs.BWD_HOPPER.items()}
    monkeypatch.setattr(configs, "BWD_HOPPER", table)
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    check(batch, seqlen_q, seqlen_k, nheads, nheads_k, 128, torch.bfloat16, causal)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lse_gradient(causal, deterministic, head_dim):
    """A loss of out and the returned LSE at a size the sm90 backward takes (delta - dLSE from a preprocess launch,
    into the one pass or the dQ kernel): dQ, dK, dV within 2x of bf16 PyTorch's error against float64."""
    from bwd_checks import assert_lse_gradients_close
    q = randn(1, 2048, 4, head_dim, dtype=torch.bfloat16)
    k, v = (randn(1, 2048, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    assert_lse_gradients_close(q, k, v, randn(1, 2048, 4, head_dim, dtype=torch.bfloat16),
                               torch.randn(1, 4, 2048, device="cuda"), causal, deterministic)


@pytest.mark.gpu
@pytest.mark.usefixtures("hopper_backward")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
def test_sinks_gradients(head_dim, causal, bwd_path):
    """learnable_sink through the sm90 forward and backward, each design: dq, dk, dv and the sinks' gradient against
    float64 (with the LSE's gradient too, and the deterministic flag)."""
    check_sinks(2, 1024, 1024, 8, 2, head_dim, torch.bfloat16, causal)
    check_sinks(1, 700, 1500, 4, 4, head_dim, torch.float16, causal, dlse=True, deterministic=True)
