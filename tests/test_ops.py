"""ops.py's gradient buffers: which tensors are slices of one packed tensor (packed_shape), the kernels writing
gradients into such slices in place (attention_backward's grads_out), and the eager backward giving packed inputs
gradients that share one buffer (shared_grads)."""
import dataclasses

import pytest
import torch
from helpers import DEVICE, poisoned_outputs, randn

import flashtile
from flashtile import ops


def test_packed_shape_of_consecutive_slices():
    qkv = randn(2, 9, 3, 4, 16, dtype=torch.float16)
    assert ops.packed_shape(*qkv.unbind(2)) == (2, 9, 3, 4, 16)
    assert ops.packed_shape(*qkv[:, :, 1:].unbind(2)) is None  # rows of three, two taken
    kv = randn(7, 2, 2, 16, dtype=torch.float16)  # varlen (total, 2, nheads_k, headdim)
    assert ops.packed_shape(*kv.unbind(1)) == (7, 2, 2, 16)


@pytest.mark.parametrize("case", ["separate", "reordered", "heads-outermost", "empty"])
def test_packed_shape_refuses_other_tensors(case):
    qkv = randn(2, 9, 3, 4, 16, dtype=torch.float16)
    parts = {"separate": [randn(2, 9, 4, 16, dtype=torch.float16) for _ in range(3)],
             "reordered": [qkv[:, :, 1], qkv[:, :, 0], qkv[:, :, 2]],
             "heads-outermost": randn(2, 9, 4, 3, 16, dtype=torch.float16).transpose(2, 3).unbind(2),
             "empty": torch.empty(2, 0, 3, 4, 16, dtype=torch.float16, device=DEVICE).unbind(2)}[case]
    assert ops.packed_shape(*parts) is None


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_gradients_written_into_packed_slices(varlen):
    """grads_out slices of one (..., 3, nheads, headdim) tensor are written in place (the same tensors come back), with
    the gradients of a call that allocates its own; GQA through kv slices (dq separate)."""
    shape = (25, ) if varlen else (2, 13)
    q = randn(*shape, 4, 32, dtype=torch.float16)
    kv = randn(*shape, 2, 2, 32, dtype=torch.float16)
    k, v = kv.unbind(-3)
    dout = randn(*shape, 4, 32, dtype=torch.float16)
    extra = {}
    if varlen:
        cu = torch.tensor([0, 9, 25], dtype=torch.int32, device=DEVICE)
        extra = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=16, max_seqlen_k=16)
    out, lse = ops.attention_forward(q, k, v, 32 ** -0.5, (-1, 0), True, **extra)
    want = ops.attention_backward(dout, q, k, v, out, lse, 32 ** -0.5, (-1, 0), True, False, **extra)
    with poisoned_outputs():
        dq, dkv = torch.empty_like(q), torch.empty_like(kv)
    into = (dq, *dkv.unbind(-3))
    got = ops.attention_backward(dout, q, k, v, out, lse, 32 ** -0.5, (-1, 0), True, False, grads_out=into, **extra)
    assert all(g is t for g, t in zip(got, into))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_eager_backward_shares_one_buffer_among_packed_inputs():
    """q, k, v sliced out of one qkv that takes a gradient: their gradients are slices of one new tensor laid out as
    qkv (what api's unpacking hands on without a copy), and equal those of separate q, k, v."""
    qkv = randn(2, 17, 3, 2, 16, dtype=torch.float16).requires_grad_()
    dout = randn(2, 17, 2, 16, dtype=torch.float16)
    parts = qkv.unbind(2)
    grads = torch.autograd.grad(flashtile.flash_attn_func(*parts, causal=True), parts, dout)
    assert ops.packed_shape(*grads) == qkv.shape and all(g._base is grads[0]._base for g in grads)
    leaves = [t.detach().clone().requires_grad_() for t in parts]
    want = torch.autograd.grad(flashtile.flash_attn_func(*leaves, causal=True), leaves, dout)
    assert ops.packed_shape(*want) is None
    for g, w in zip(grads, want):
        assert torch.equal(g, w)


class _FakeReplay:
    """Stands in for a kernel's Replay: records the tensors each launch hands it."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def launch(self, device, tensors):
        self.calls.append((self.name, tensors))


def _one_pass_stubs(monkeypatch):
    """Dispatch told the GPU is an sm90 one; every Replays.launch records its call and hands back a _FakeReplay
    (what a compiled launch keeps); returns the list of (launch, tensors) and the dispatch calls."""
    from flashtile import configs, dispatch
    from flashtile.kernels.common import replay
    from flashtile.kernels.hopper import bwd as bwd_hopper
    calls, plans = [], []
    monkeypatch.setattr(dispatch, "runs_gluon", lambda device: True)
    monkeypatch.setattr(bwd_hopper, "supports", lambda *args: True)
    monkeypatch.setattr(configs, "BWD_HOPPER", dict(configs.BWD_HOPPER))
    monkeypatch.setattr(ops, "_ONE_PASS", replay.Kept())
    backward = dispatch.backward
    monkeypatch.setattr(dispatch, "backward", lambda *args, **kw: plans.append(args) or backward(*args, **kw))

    def launch(self, key, device, tensors, first, found=None):
        name = key[-2] if isinstance(key[-2], str) else "dkdv"  # ("delta", "cast": the launchers' key tags)
        calls.append((name, tensors))
        if found is not None:
            found.append(_FakeReplay(name, calls))
    monkeypatch.setattr(replay.Replays, "launch", launch)
    return calls, plans


def _replay_stub(calls):
    """A stand-in for a launcher's Replay class: its first launch and its replays are appended to ``calls``."""
    class Made:
        def __init__(self, kernel, grid, args, kwargs, slots):
            self.compiled = object()
            calls.append(("first", args))

        def prepare_raw(self):
            pass

        def launch(self, device, tensors):
            calls.append(("again", tensors))
    return Made


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_repeated_plain_forward_replays_without_dispatch(causal, monkeypatch):
    """A plain forward's second call of the same launch key launches the replay the first made with its own tensors
    in the same slots, without dispatch; a new counter on the stream (another stream, a graph capture), another
    key or another config table goes the first call's way."""
    from types import SimpleNamespace

    from flashtile import configs, dispatch
    from flashtile.kernels.common import replay
    from flashtile.kernels.hopper import fwd_launch
    calls, plans, stream = [], [], {"counter": torch.zeros(8, dtype=torch.int32)}

    Made = _replay_stub(calls)
    monkeypatch.setattr(dispatch, "runs_gluon", lambda device: True)
    monkeypatch.setattr(fwd_launch, "supports", lambda *args: True)
    monkeypatch.setattr(configs, "FWD_HOPPER", dict(configs.FWD_HOPPER))
    monkeypatch.setattr(ops, "_FORWARD_AGAIN", replay.Kept())
    monkeypatch.setattr(fwd_launch, "_REPLAYS", replay.Replays())
    monkeypatch.setattr(fwd_launch, "Replay", Made)
    monkeypatch.setattr(fwd_launch, "launch_args",
                        lambda *args: ((1, ), args, {"SWITCHES": SimpleNamespace(STAGE_O=True)}))
    monkeypatch.setattr(fwd_launch, "stream_counter", lambda device, size: stream["counter"])
    monkeypatch.setattr(fwd_launch, "is_stream_counter", lambda device, counter: counter is stream["counter"])
    forward = dispatch.forward
    monkeypatch.setattr(dispatch, "forward", lambda *args, **kw: plans.append(args) or forward(*args, **kw))
    window = (-1, 0) if causal else (-1, -1)

    def call(seqlen=300, sinks=None):
        q, k, v = (randn(2, seqlen, 4, 128, dtype=torch.bfloat16) for _ in range(3))
        calls.clear()
        out, lse = ops.attention_forward(q, k, v, 0.088, window, True, sinks=sinks)
        return (q, k, v, out, lse), list(calls)

    _, first = call()
    assert [name for name, _ in first] == ["first"] and len(plans) == 1
    (q, k, v, out, lse), again = call()
    assert len(plans) == 1 and [name for name, _ in again] == ["again"]
    assert all(a is b for a, b in zip(again[0][1], (q, k, v, out, out, lse, lse, q, k, v)))
    assert again[0][1][10:] == (None, None)
    stream["counter"] = torch.zeros(8, dtype=torch.int32)  # another stream's counter: the replay holds the old one
    _, moved = call()
    assert len(plans) == 2 and [name for name, _ in moved] == ["first"]
    call(seqlen=301)
    assert len(plans) == 3
    monkeypatch.setattr(configs, "FWD_HOPPER", dict(configs.FWD_HOPPER))
    call()
    assert len(plans) == 4
    call(sinks=torch.randn(4, device=DEVICE))  # sinks: a key of its own; its replays take each call's sinks
    sinks = torch.randn(4, device=DEVICE)
    _, with_sinks = call(sinks=sinks)
    assert len(plans) == 5 and with_sinks[0][0] == "again" and with_sinks[0][1][6] is sinks


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_repeated_plain_portable_forward_replays_without_dispatch(causal, monkeypatch):
    """The same for the portable forward (another GPU, or rows below the sm90 chains): a plain call's second call of
    the same launch key launches its replay with its own tensors, sinks too, without dispatch; another key, a softcap
    (not plain) or another config table goes the first call's way."""
    from flashtile import configs, dispatch
    from flashtile.kernels.common import replay
    from flashtile.kernels.portable import fwd
    calls, plans = [], []

    Made = _replay_stub(calls)
    monkeypatch.setattr(ops, "_FORWARD_AGAIN", replay.Kept())
    monkeypatch.setattr(fwd, "_REPLAYS", replay.Replays())
    monkeypatch.setattr(fwd, "Replay", Made)
    monkeypatch.setattr(dispatch, "runs_gluon", lambda device: False)
    forward = dispatch.forward
    monkeypatch.setattr(dispatch, "forward", lambda *args, **kw: plans.append(args) or forward(*args, **kw))
    window = (-1, 0) if causal else (-1, -1)

    def call(seqlen=300, sinks=None, softcap=0.0):
        q, k, v = (randn(2, seqlen, 4, 64, dtype=torch.float16) for _ in range(3))
        calls.clear()
        out, lse = ops.attention_forward(q, k, v, 0.125, window, True, sinks=sinks, softcap=softcap)
        return (q, k, v, out, lse), list(calls)

    _, first = call()
    assert [name for name, _ in first] == ["first"] and len(plans) == 1
    (q, k, v, out, lse), again = call()
    assert len(plans) == 1 and [name for name, _ in again] == ["again"]
    assert all(a is b for a, b in zip(again[0][1], (q, k, v, out, lse))) and again[0][1][5:] == (None, ) * 4
    call(seqlen=301)
    assert len(plans) == 2
    call(softcap=5.0)
    call(softcap=5.0)
    assert len(plans) == 4
    for name in ("FWD_INTERPRETER", "FWD_FP32", "FWD_SM90", "FWD_GENERIC"):  # equal tables, but other objects
        table = getattr(configs, name)
        monkeypatch.setattr(configs, name, dict(table) if isinstance(table, dict) else dataclasses.replace(table))
    call()
    assert len(plans) == 5
    sinks = randn(4, dtype=torch.float32)
    call(sinks=sinks)
    _, with_sinks = call(sinks=sinks)
    assert len(plans) == 6 and with_sinks[0][0] == "again" and with_sinks[0][1][8] is sinks


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_repeated_plain_backward_replays_the_one_pass_without_dispatch(causal, monkeypatch):
    """A plain call's second backward of the same launch key launches the three replays the first found (delta and
    the zeroed dQacc, dK/dV, the dQ cast) with its own tensors in the same places, without dispatch; a call with
    another key, deterministic=True or another config table goes the first call's way."""
    calls, plans = _one_pass_stubs(monkeypatch)
    window = (-1, 0) if causal else (-1, -1)

    def backward(deterministic=False, seqlen=300):
        q, k, v, dout, out = (randn(2, seqlen, 4, 128, dtype=torch.bfloat16) for _ in range(5))
        lse = randn(2, 4, seqlen, dtype=torch.float32)
        calls.clear()
        grads = ops.attention_backward(dout, q, k, v, out, lse, 0.088, window, True, deterministic)
        return (q, k, v, dout, out, lse), grads, list(calls)

    (first_in, first_grads, first_calls) = backward()
    assert [name for name, _ in first_calls] == ["delta", "dkdv", "cast"] and len(plans) == 1
    (inputs, grads, again) = backward()
    assert len(plans) == 1 and [name for name, _ in again] == ["delta", "dkdv", "cast"]
    mapping = {id(t): i for i, t in enumerate(first_in + first_grads)}
    for (_, was), (_, now) in zip(first_calls, again):  # each slot: the same input or gradient as in the first call
        where = {id(t): i for i, t in enumerate(inputs + grads)}
        assert [mapping.get(id(t)) if t is not None else None for t in was] == \
            [where.get(id(t)) if t is not None else None for t in now]
    assert again[0][1][4] is again[1][1][8] is again[2][1][0]  # one new float32 dQacc through the three launches
    assert again[0][1][4] is not first_calls[0][1][4] and again[0][1][4].dtype == torch.float32
    backward(seqlen=301)
    backward(deterministic=True)
    assert len(plans) == 3
    from flashtile import configs
    monkeypatch.setattr(configs, "BWD_HOPPER", dict(configs.BWD_HOPPER))
    backward()
    assert len(plans) == 4
