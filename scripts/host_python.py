"""The Python of the sm90 forward's and backward's host paths, timed on any machine (the CPU will do):
``flashtile.flash_attn_func`` and ``ops.attention_backward`` on CPU tensors with dispatch told the GPU is an sm90 one
and every launch stubbed out (the forward's replay found, its counter a CPU tensor; the checks let CPU tensors by),
so what is timed is the checks, the dispatch, the allocations, the launch keys and the descriptors' views, not Triton
or the GPU. Host-path changes can be A/B'd here between device sessions; their effect on a real step is measured on
the GPU (scripts/step_host.py --parts). B=1, N=128, H=16, D=128, bf16, causal; µs per call, the best of the turns:
``python scripts/host_python.py [--turns 5] [--cprofile forward|backward|step]``."""
import argparse
import cProfile
import pstats
from unittest import mock

import torch
from profile_host import per_call_us

import flashtile
from flashtile import checks, dispatch, ops
from flashtile.kernels.common import replay
from flashtile.kernels.hopper import fwd_launch


class _Descriptor:
    """A host TMA descriptor's fields (detach_descriptor copies them)."""

    def __init__(self, t):
        self.base, self.shape, self.strides, self.block_shape = t, list(t.shape), list(t.stride()), [128, 128]


class _FoundReplay:
    """What fwd_launch's replay cache holds after a key's first call, its raw launch with a C launcher that does
    nothing: four descriptor slots, then eight tensors and twenty integers. The forward calls ``launch`` with tensors;
    trees from before the raw launch took tensors call ``run`` with descriptors (their _RawLaunch takes those)."""
    stage_o = True

    def __init__(self, q):
        self.descriptors = [_Descriptor(q) for _ in range(4)]
        raw = self.raw = object.__new__(replay._RawLaunch)
        raw.head, raw.launch, raw.expand, raw.encoded = (), lambda *args: None, lambda desc, meta: [desc], {}
        raw.template, raw.plain = [0] * 28, [(4 + i, i) for i in range(8)]
        raw.descs, raw.templates = [(k, 8, None) for k in range(4)], dict(enumerate(self.descriptors))

    def run(self, device, *tensors):
        self.raw((1, 1, 1), 0, tensors)

    def launch(self, device, tensors):
        self.raw((1, 1, 1), 0, tensors)


class _NoLaunch:
    """A replay found for a launch key that launches nothing."""

    def launch(self, device, tensors):
        pass


def _found_launch(self, key, device, tensors, first, found=None):
    """Replays.launch with every key's replay found and nothing launched."""
    if found is not None:
        found.append(_NoLaunch())


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--cprofile", choices=["forward", "backward", "step"])
    args = parser.parse_args(argv)
    q, k, v, dout, out = (torch.randn(1, 128, 16, 128, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.randn(1, 16, 128)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    found = _FoundReplay(q)
    rows = {
        "flash_attn_func, forward only (sm90 path)": lambda: flashtile.flash_attn_func(q, k, v, causal=True),
        "dispatch.forward": lambda: dispatch.forward(q, k, v, (-1, 0)),
        "ops.attention_backward (sm90 path)": lambda: ops.attention_backward(dout, q, k, v, out, lse, 0.088, (-1, 0),
                                                                             True, False),
        "dispatch.backward": lambda: dispatch.backward(q, k, v, dout, (-1, 0)),
        "flash_attn_func, forward + backward (autograd)": lambda: torch.autograd.grad(
            flashtile.flash_attn_func(*leaves, causal=True), leaves, dout),
    }
    with mock.patch.object(dispatch, "runs_gluon", lambda device: True), \
            mock.patch.object(replay.Replays, "launch", _found_launch), \
            mock.patch.object(fwd_launch._REPLAYS, "get", lambda key: found), \
            mock.patch.object(fwd_launch, "stream_counter", lambda device, size: lse), \
            mock.patch.object(fwd_launch, "is_stream_counter", lambda device, counter: True, create=True), \
            mock.patch.object(checks, "interpreter_enabled", lambda: True), \
            mock.patch.object(checks, "_interpreter_loaded_late", lambda: False):
        print(f"plans: {dispatch.forward(q, k, v, (-1, 0))}; {dispatch.backward(q, k, v, dout, (-1, 0))}")
        best = {}
        for _ in range(args.turns):
            for name, fn in rows.items():
                us = per_call_us(fn, args.calls)
                best[name] = min(best.get(name, us), us)
        for name, us in best.items():
            print(f"| {name} | {us:.1f} µs |")
        if args.cprofile:
            profile = cProfile.Profile()
            row = {"forward": rows["flash_attn_func, forward only (sm90 path)"],
                   "backward": rows["ops.attention_backward (sm90 path)"],
                   "step": rows["flash_attn_func, forward + backward (autograd)"]}[args.cprofile]
            profile.runcall(lambda: [row() for _ in range(2000)])
            pstats.Stats(profile).sort_stats("tottime").print_stats(20)
            pstats.Stats(profile).sort_stats("cumulative").print_stats("flashtile", 25)


if __name__ == "__main__":
    main()
