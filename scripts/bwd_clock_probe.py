"""The backward of flashtile and of FA4 (where importable) at the SM clock and power each one runs at: is a cell
lost to cycles or to the power limit? One process, taking turns, each on its own forward's output:

    PYTHONPATH=. python3 scripts/bwd_clock_probe.py [--head-dims 64 128] [--seqlens 1024 16384] [--rounds 3]

Times torch.autograd.grad of each one's output (the backward's launches only, the graph kept), do_bench medians,
the median over turns (bwd_ab.median_ms), and reads nvidia-smi's SM clock and power right after each one's turns;
prints a markdown row per (D, causal, N): TFLOP/s, MHz, W of each and their ratios.
"""
import argparse
import subprocess

import torch
from bwd_ab import median_ms

from flashtile.bench.__main__ import HIDDEN, TOKENS
from flashtile.bench.peers import FORWARD


def clocks():
    """(SM MHz, watts) now."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.split(",")
    return int(out[0]), float(out[1])


def peers():
    """flashtile, and FA4 where it imports: the bench's peers (flashtile.bench.peers)."""
    names = ["flashtile"]
    try:
        import flash_attn.cute.interface  # noqa: F401
        names.append("FA4")
    except ImportError:
        pass
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    names = peers()
    print("| D | causal | N | " + " | ".join(f"{n} TFLOP/s | {n} MHz, W" for n in names)
          + " | TFLOP/s ratio | MHz ratio |")
    print("|---|---|---|" + "---|---|" * len(names) + "---|---|")
    for d in args.head_dims:
        for causal in (False, True):
            for n in args.seqlens:
                b, h = max(1, TOKENS // n), HIDDEN // d
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                dout = torch.randn_like(q)
                runs = {}
                for name in names:
                    prepare, run = FORWARD[name](causal)
                    leaves = [t.requires_grad_() for t in prepare(q, k, v)]
                    out = run(*leaves)
                    runs[name] = (lambda out, leaves: lambda: torch.autograd.grad(out, leaves, dout,
                                                                                   retain_graph=True))(out, leaves)
                seen = {}
                ms = median_ms(runs, args.rounds, warmup=100, rep=500,
                               after=lambda name: seen.__setitem__(name, clocks()))
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
                tf = {name: flops / ms[name] * 1e-9 for name in names}
                cells = " | ".join(f"{tf[x]:.0f} | {seen[x][0]}, {seen[x][1]:.0f}" for x in names)
                ratio = (f"{tf[names[0]] / tf[names[1]]:.3f} | {seen[names[0]][0] / seen[names[1]][0]:.3f}"
                         if len(names) > 1 else "- | -")
                print(f"| {d} | {causal} | {n} | {cells} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
