"""What a backward program pays once against what it pays per query row (issue 36): the main backward kernel's time
(from the profiler) at a fixed key length and a growing query length, non-causal, for flashtile and FA4 (where
importable) on the same tensors; a least-squares line time = fixed + per_row · Nq per peer and head dim. Each K/V
tile is one program in both, so ``fixed`` is the programs' prologue and epilogue (over the waves), ``per_row`` their
steps.
Run on the GPU: ``PYTHONPATH=. python scripts/bwd_fixed_cost.py [--seqlen-k 4096] [--head-dims 64 128]``."""
import argparse

import torch
from step_profile import kernel_times

from flashtile.bench.__main__ import peer_step
from flashtile.bench.peers import FORWARD


def main_kernel_us(step, forward_names):
    """The longest kernel of one step that is not the forward's, in µs (mean of 5 steps), and its name."""
    step()
    kernels = {name: us for name, us in kernel_times(step).items() if name not in forward_names}
    name = max(kernels, key=kernels.get)
    return kernels[name], name


def fit(xs, ys):
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlen-k", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens-q", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    args = parser.parse_args(argv)
    print("| peer | D | " + " | ".join(f"Nq={n} µs" for n in args.seqlens_q) + " | fixed µs | µs per 1k rows "
          "| fixed in rows | kernel |")
    print("|---|---|" + "---|" * (len(args.seqlens_q) + 4))
    for d in args.head_dims:
        h = 2048 // d
        k, v = (torch.randn(args.batch, args.seqlen_k, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        qs = {n: torch.randn(args.batch, n, h, d, device="cuda", dtype=torch.bfloat16) for n in args.seqlens_q}
        for name in ("flashtile", "FA4"):
            try:
                fwd = peer_step(FORWARD[name], False, qs[args.seqlens_q[-1]], k, v)
            except ImportError:  # FA4 not installed
                continue
            forward_names = set(kernel_times(fwd, 1))
            times, kernel = [], ""
            for n in args.seqlens_q:
                us, kernel = main_kernel_us(peer_step(FORWARD[name], False, qs[n], k, v, True), forward_names)
                times.append(us)
            fixed, per_row = fit(args.seqlens_q, times)
            print(f"| {name} | {d} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {fixed:.1f} | "
                  f"{per_row * 1000:.1f} | {fixed / per_row:.0f} | {kernel[:60]} |", flush=True)


if __name__ == "__main__":
    main()
