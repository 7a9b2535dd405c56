"""Does the sm90 backward's speed depend on its inputs' values? One shape, the same launches (kernels/hopper/bwd.py,
launch_bwd_hopper) on the forward's own O and LSE, and on an LSE raised by 200 nats (every P underflows to 0, so
the dV and dK products and the dQ reduce take zeros), taking turns in one process (bwd_ab.median_ms):

    PYTHONPATH=. python3 scripts/bwd_lse_probe.py [--head-dim 128] [--seqlens 1024 16384] [--rounds 5]

Prints a markdown row per (causal, N): backward TFLOP/s of both, and the GPU's SM clock and power read by nvidia-smi
right after each one's last turn.
"""
import argparse
import functools

import torch
from bwd_ab import median_ms
from bwd_clock_probe import clocks

from flashtile import checks, ops
from flashtile.bench.__main__ import HIDDEN, TOKENS
from flashtile.kernels.hopper.bwd import launch_bwd_hopper


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 16384])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    d = args.head_dim
    print("| causal | N | forward's LSE TFLOP/s | MHz, W | LSE + 200 TFLOP/s | MHz, W | ratio |")
    print("|---|---|---|---|---|---|---|")
    for causal in (False, True):
        window = checks.window((-1, -1), causal)
        for n in args.seqlens:
            b, h = max(1, TOKENS // n), HIDDEN // d
            q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            out, lse = ops.attention_forward(q, k, v, d ** -0.5, window, True)
            grads = [torch.empty_like(t) for t in (q, k, v)]
            runs = {name: functools.partial(launch_bwd_hopper, dout, q, k, v, out, lse + shift, *grads, d ** -0.5,
                                            window, True) for name, shift in (("real", 0.0), ("zero", 200.0))}
            seen = {}
            ms = median_ms(runs, args.rounds, warmup=100, rep=500, after=lambda name: seen.__setitem__(name, clocks()))
            flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
            tf = {name: flops / t * 1e-9 for name, t in ms.items()}
            real, zero = seen["real"], seen["zero"]
            print(f"| {causal} | {n} | {tf['real']:.0f} | {real[0]}, {real[1]:.0f} | {tf['zero']:.0f} | {zero[0]}, "
                  f"{zero[1]:.0f} | {tf['zero'] / tf['real']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
