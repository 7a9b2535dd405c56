"""flashtile/dispatch.py: the plan (kernel file, config, design) that serves a call, on any machine; sm90 is
pretended where a test needs it (the kernels' own ``supports`` still judge the tensors)."""
import pytest
import torch

from flashtile import configs, dispatch
from flashtile.kernels.hopper.common import GLUON_VERSION_OK


@pytest.fixture
def sm90(monkeypatch):
    """Plans as on an H100/H200: the arch reads (9, 0), no interpreter, the configs' backends on "auto"."""
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernels are written against triton 3.6")
    monkeypatch.setattr(dispatch, "arch", lambda device: (9, 0))
    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(configs, "FWD_BACKEND", "auto")
    monkeypatch.setattr(configs, "BWD_BACKEND", "auto")


def tensors(seqlen, head_dim, heads=8, kv_heads=2, dtype=torch.bfloat16):
    q = torch.randn(1, seqlen, heads, head_dim, dtype=dtype)
    k = torch.randn(1, seqlen, kv_heads, head_dim, dtype=dtype)
    return q, k, k.clone(), torch.randn_like(q)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
def test_sm90_plans_name_the_gluon_kernels_and_their_configs(sm90, head_dim, causal):
    window = (-1, 0) if causal else (-1, -1)
    q, k, v, dout = tensors(4096, head_dim)
    forward = dispatch.forward(q, k, v, window)
    assert forward == dispatch.Plan("hopper/fwd.py", configs.FWD_HOPPER[(head_dim, causal)])
    config = configs.BWD_HOPPER[(head_dim, causal)]
    backward = dispatch.backward(q, k, v, dout, window)
    assert backward == dispatch.Plan("hopper/bwd.py", config, config.design(False))
    exact = dispatch.backward(q, k, v, dout, window, deterministic=True)
    assert exact.design == config.design(True) and exact.design != "one pass"
    assert str(backward).startswith(f"kernels/hopper/bwd.py ({config.design(False)}) with HopperBwdConfig(")


def test_sm90_plans_fall_back_to_the_portable_kernels(sm90):
    q, k, v, dout = tensors(4096, 128)
    softcap = dispatch.forward(q, k, v, (-1, -1), softcap=30.0)  # the sm90 forward caps scores; ALiBi is portable's
    assert softcap == dispatch.Plan("hopper/fwd.py", configs.FWD_HOPPER[(128, False)])
    alibi = dispatch.forward(q, k, v, (-1, -1), alibi_slopes=torch.ones(8))
    assert alibi == dispatch.Plan("portable/fwd.py", configs.FWD_SM90[(128, False)])
    window = dispatch.backward(q, k, v, dout, (128, 0))  # sliding window: the sm90 kernels both ways (non-causal's)
    assert window == dispatch.Plan("hopper/bwd.py", configs.BWD_HOPPER[(128, False)], "one pass")
    assert dispatch.forward(q, k, v, (1024, 0)) == dispatch.Plan("hopper/fwd.py", configs.FWD_HOPPER[(128, False)])
    assert dispatch.forward(q, k, v, (128, 0)).kernel == "portable/fwd.py"  # narrower than min_window
    packed_window = [t.flatten(0, 1) for t in (q, k, v, dout)]  # packed with a window: the sm90 kernels too
    assert dispatch.backward(*packed_window, (128, 0), packed=True).design == "one pass"
    assert dispatch.backward(*packed_window, (128, 0), packed=True, deterministic=True).kernel == "portable/bwd.py"
    assert dispatch.forward(*packed_window[:3], (1024, 0), 4096).kernel == "hopper/fwd.py"
    packed = [t.flatten(0, 1) for t in (q, k, v, dout)]  # packed sequences: the one pass, not the two kernels
    assert dispatch.backward(*packed, (-1, -1), packed=True).kernel == "hopper/bwd.py"
    assert dispatch.backward(*packed, (-1, -1), packed=True, deterministic=True).kernel == "portable/bwd.py"
    assert dispatch.backward(q, k, v, dout, (-1, -1), alibi_slopes=torch.ones(8)).kernel == "portable/bwd.py"
    one_key = tensors(1, 128)  # the sm90 backward takes every length
    assert dispatch.backward(*one_key, (-1, -1)).kernel == "hopper/bwd.py"
    d59 = tensors(4096, 59)  # rows of 118 bytes: no TMA view
    assert dispatch.forward(*d59[:3], (-1, -1)).kernel == "portable/fwd.py"
    assert dispatch.backward(*d59, (-1, -1)).kernel == "portable/bwd.py"
    fp32 = tensors(4096, 128, dtype=torch.float32)
    assert dispatch.forward(*fp32[:3], (-1, -1)) == dispatch.Plan("portable/fwd.py", configs.FWD_FP32[128])


def test_a_padded_head_dim_takes_its_tiles_configs(sm90):
    """D=96 and D=192 run the sm90 kernels in tiles of 128 and 256 columns, with those tiles' configs."""
    for head_dim, tile in ((96, 128), (192, 256), (40, 64)):
        q, k, v, dout = tensors(4096, head_dim)
        for window, causal in (((-1, -1), False), ((-1, 0), True)):
            assert dispatch.forward(q, k, v, window).config == configs.FWD_HOPPER[(tile, causal)]
            plan = dispatch.backward(q, k, v, dout, window)
            assert plan.kernel == "hopper/bwd.py" and plan.config == configs.BWD_HOPPER[(tile, causal)]


def test_the_forward_takes_the_config_below_under_its_min_seqlen_q(sm90):
    config = configs.FWD_HOPPER[(128, False)]
    q, k, v, _ = tensors(config.min_seqlen_q - 1, 128)
    assert dispatch.forward(q, k, v, (-1, -1)) == dispatch.Plan("hopper/fwd.py", config.below)
    assert dispatch.forward(q, k, v, (-1, -1), seqlen_q=config.min_seqlen_q).config == config  # packed: longest


def test_here_the_plans_are_the_portable_kernels_in_the_interpreter():
    q, k, v, dout = tensors(64, 64, dtype=torch.float16)
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine plans for its GPU")
    assert dispatch.forward(q, k, v, (-1, 0)) == dispatch.Plan("portable/fwd.py", configs.FWD_INTERPRETER)
    assert dispatch.backward(q, k, v, dout, (-1, 0)) == dispatch.Plan("portable/bwd.py", configs.BWD_INTERPRETER)


def test_the_sm90_backward_pick_holds_on_any_machine(monkeypatch):
    """hopper_backward_pick (what ``flashtile info`` prints for an sm90 GPU) gives the config the sm90 dispatch uses,
    here too, and None where the portable backward would run."""
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernels are written against triton 3.6")
    monkeypatch.setattr(configs, "BWD_BACKEND", "auto")
    q, k, v, dout = tensors(1024, 64)
    assert dispatch.hopper_backward_pick(q, k, v, dout, (-1, 0)) is configs.BWD_HOPPER[(64, True)]
    assert dispatch.hopper_backward_pick(q, k, v, dout, (128, 0)) is configs.BWD_HOPPER[(64, False)]  # a window
    packed = [t.flatten(0, 1) for t in (q, k, v, dout)]  # (total, nheads, headdim): the one pass, not two kernels
    assert dispatch.hopper_backward_pick(*packed, (-1, -1), packed=True) is configs.BWD_HOPPER[(64, False)]
    assert dispatch.hopper_backward_pick(*packed, (-1, -1), packed=True, deterministic=True) is None
    assert dispatch.hopper_backward_pick(*tensors(1024, 96), (-1, -1)) is configs.BWD_HOPPER[(128, False)]
    assert dispatch.hopper_backward_pick(*tensors(1024, 59), (-1, -1)) is None
    monkeypatch.setattr(configs, "BWD_BACKEND", "portable")
    assert dispatch.hopper_backward_pick(q, k, v, dout, (-1, -1)) is None


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (1000, 0)], ids=["full", "causal", "window"])
def test_ops_hands_the_plan_to_the_hopper_launchers(sm90, window, monkeypatch):
    """ops executes dispatch's plans: on sm90 (pretended) the forward and the backward reach the launchers of the
    kernels/hopper modules that dispatch.hopper loads, with the plan's config and the window (recorded here, nothing
    launched)."""
    from flashtile import ops
    calls = []
    fwd_launch, bwd = dispatch.hopper("fwd_launch"), dispatch.hopper("bwd")

    def forward(*args):
        assert args[9] == window and args[14:] == (0.0, )
        calls.append(("forward", args[11]))
    monkeypatch.setattr(fwd_launch, "launch_fwd_hopper", forward)

    def backward(*args, **kwargs):
        assert args[10] == window
        calls.append(("backward", args[-1]))
        return torch.zeros_like(args[5]), None
    monkeypatch.setattr(bwd, "launch_bwd_hopper", backward)
    q, k, v, dout = tensors(1024, 128)
    causal = dispatch.is_causal(window)
    out, lse = ops.attention_forward(q, k, v, 0.1, window, True)
    ops.attention_backward(dout, q, k, v, out, lse, 0.1, window, True, False)
    assert calls == [("forward", dispatch.forward(q, k, v, window).config),
                     ("backward", dispatch.backward(q, k, v, dout, window).config)]
    assert any(c is calls[0][1] for c in configs.hopper_fwd_chain(configs.FWD_HOPPER[(128, causal)]))
    assert calls[1][1] is configs.BWD_HOPPER[(128, causal)]
