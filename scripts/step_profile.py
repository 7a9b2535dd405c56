"""A training step's time against its kernels' (issue 36, item 3): forward + backward through autograd, eager, timed by
do_bench, beside the sum of the CUDA kernels the profiler records for one step, kernel by kernel; ``--peers`` does the
same for FA4 (where importable) and cuDNN, as flashtile.bench calls them (bench/peers.py), on the same inputs.
Run on the GPU: ``PYTHONPATH=. python scripts/step_profile.py [--seqlens 1024 2048] [--head-dim 128] [--peers]``."""
import argparse
import collections

import torch
import triton

from flashtile.bench.__main__ import peer_step
from flashtile.bench.peers import FORWARD


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--peers", action="store_true", help="also FA4 (where importable) and cuDNN")
    args = parser.parse_args(argv)
    d = args.head_dim
    names = ["flashtile"] + (["FA4", "cuDNN"] if args.peers else [])
    print("| peer | causal | N | fwd ms | fwd+bwd ms | kernels of one step, ms | step / kernels | kernels (µs each) |")
    print("|---|---|---|---|---|---|---|---|")
    for causal in map(bool, args.causal):
        for n in args.seqlens:
            b, h = max(1, 16384 // n), 2048 // d
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for name in names:
                try:
                    fwd, step = (peer_step(FORWARD[name], causal, q, k, v, backward) for backward in (False, True))
                except ImportError:  # FA4 not installed
                    continue
                measure(name, fwd, step, causal, n)


def kernel_times(step, steps=5):
    """µs a step of each CUDA kernel that ``step`` runs, the mean of ``steps`` steps under the profiler."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] += e.device_time / steps
    return kernels


def measure(peer, fwd, step, causal, n):
    """One table row: a peer's forward and step times (flashtile.bench's calls) and its step's kernels."""
    step()
    fwd_ms = triton.testing.do_bench(fwd, warmup=25, rep=100)
    step_ms = triton.testing.do_bench(step, warmup=25, rep=100)
    kernels = {name: us / 1000 for name, us in kernel_times(step).items()}
    total = sum(kernels.values())
    names = ", ".join(f"{name[:70]} {ms * 1000:.0f}" for name, ms in sorted(kernels.items(), key=lambda x: -x[1]))
    print(f"| {peer} | {'yes' if causal else 'no'} | {n} | {fwd_ms:.3f} | {step_ms:.3f} | {total:.3f} | "
          f"{step_ms / total:.2f} | {names} |", flush=True)


if __name__ == "__main__":
    main()
