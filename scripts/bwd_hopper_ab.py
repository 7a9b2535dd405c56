"""The sm90 backward (kernels/hopper/bwd.launch_bwd_hopper, every launch of it) against another version of
kernels/hopper/bwd.py, in one process, taking turns:

    PYTHONPATH=. python3 scripts/bwd_hopper_ab.py --old path/to/old/hopper/bwd.py [--rounds 3]

The old file is loaded as a module of flashtile.kernels.hopper (its relative imports resolve there), so only
kernels/hopper/bwd.py may differ. Each shape (B·N = 16k tokens, H·D = 2048, bf16) times both with the shipped
config, do_bench medians, the median over turns; prints a markdown row per shape (backward TFLOP/s, old / new time)
and checks that the two agree.
"""
import argparse
import functools

import torch
from bwd_ab import HIDDEN, TOKENS, load_old, median_ms

from flashtile.kernels.hopper import bwd as new_module


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the other kernels/hopper/bwd.py")
    parser.add_argument("--rounds", type=int, default=3, help="turns each version takes per shape")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    args = parser.parse_args()
    modules = {"old": load_old(args.old, "_bwd_old", "flashtile.kernels.hopper"), "new": new_module}
    print("| D | causal | N | old TFLOP/s | new TFLOP/s | old / new time | max |new − old| (dq, dk, dv) |")
    print("|---|---|---|---|---|---|---|")
    for d in args.head_dims:
        for causal in (False, True):
            for n in args.seqlens:
                b, h = max(1, TOKENS // n), HIDDEN // d
                q, k, v, out, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(5))
                lse = torch.randn(b, h, n, device="cuda").abs() + n ** 0.5
                grads = {}

                def run(name):
                    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                    modules[name].launch_bwd_hopper(dout, q, k, v, out, lse, dq, dk, dv, d ** -0.5, causal, True)
                    grads[name] = (dq, dk, dv)
                ms = median_ms({name: functools.partial(run, name) for name in ("old", "new")}, args.rounds)
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
                diff = ", ".join(f"{(a.float() - c.float()).abs().max().item():.2g}"
                                 for a, c in zip(grads["new"], grads["old"]))
                print(f"| {d} | {causal} | {n} | {flops / ms['old'] * 1e-9:.0f} | {flops / ms['new'] * 1e-9:.0f} | "
                      f"{ms['old'] / ms['new']:.3f} | {diff} |", flush=True)


if __name__ == "__main__":
    main()
