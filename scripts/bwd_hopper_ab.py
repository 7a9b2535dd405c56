"""The sm90 backward (kernels/hopper/bwd.launch_bwd_hopper, every launch of it) against other versions of
kernels/hopper/bwd.py or of the whole kernels/hopper folder, in one process, taking turns:

    PYTHONPATH=. python3 scripts/bwd_hopper_ab.py --old path/to/old/bwd.py [other.py | folder ...] [--rounds 3]
        [--rep 100] [--deterministic]

Each other file is loaded as a module of flashtile.kernels.hopper (its relative imports resolve there), so only
kernels/hopper/bwd.py may differ; a folder (a copy of kernels/hopper) is loaded as a package beside it, so that its
dQ, split and common modules count too. ``--deterministic`` times the two-kernel design. Each shape (B·N = 16k
tokens, H·D = 2048, bf16) times all with the shipped config on the forward's own O and LSE, do_bench medians, the
median over turns; prints a markdown row per shape (backward TFLOP/s of each, its time over the new one's) and the
largest difference of each from the new one's gradients.
"""
import argparse
import functools
import importlib
import importlib.util
import sys
from pathlib import Path

import torch
from bwd_ab import HIDDEN, TOKENS, load_old, median_ms

from flashtile import checks, ops
from flashtile.kernels.hopper import bwd as new_module


def load_version(path, i):
    """The bwd module of ``path``: a file (another kernels/hopper/bwd.py) or a folder (a copy of kernels/hopper)."""
    if not Path(path).is_dir():
        return load_old(path, f"_bwd_old{i}", "flashtile.kernels.hopper")
    name = f"flashtile.kernels._hopper_old{i}"
    spec = importlib.util.spec_from_file_location(name, Path(path) / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])
    return importlib.import_module(f"{name}.bwd")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, nargs="+", help="other versions of kernels/hopper/bwd.py, or folders")
    parser.add_argument("--rounds", type=int, default=3, help="turns each version takes per shape")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--rep", type=float, default=100, help="do_bench repeats, ms (3000: a training job's clocks)")
    parser.add_argument("--deterministic", action="store_true", help="the two-kernel design (dQ without atomics)")
    args = parser.parse_args()
    modules = {Path(path).stem: load_version(path, i) for i, path in enumerate(args.old)}
    modules["new"] = new_module
    others = [name for name in modules if name != "new"]
    print("| D | causal | N | " + " | ".join(f"{name} TFLOP/s" for name in modules) + " | "
          + " | ".join(f"{name} / new time" for name in others) + " | max |new − other| (dq, dk, dv) |")
    print("|---|---|---|" + "---|" * (2 * len(modules) - 1) + "---|")
    for d in args.head_dims:
        for causal in (False, True):
            window = checks.window((-1, -1), causal)
            for n in args.seqlens:
                b, h = max(1, TOKENS // n), HIDDEN // d
                q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                out, lse = ops.attention_forward(q, k, v, d ** -0.5, (-1, 0) if causal else (-1, -1), True)
                grads = {}

                def run(name):
                    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                    modules[name].launch_bwd_hopper(dout, q, k, v, out, lse, dq, dk, dv, d ** -0.5, window, True,
                                                    args.deterministic)
                    grads[name] = (dq, dk, dv)
                ms = median_ms({name: functools.partial(run, name) for name in modules}, args.rounds, rep=args.rep)
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
                diff = "; ".join(", ".join(f"{(a.float() - c.float()).abs().max().item():.2g}"
                                           for a, c in zip(grads["new"], grads[name])) for name in others)
                print(f"| {d} | {causal} | {n} | " + " | ".join(f"{flops / ms[name] * 1e-9:.0f}" for name in modules)
                      + " | " + " | ".join(f"{ms[name] / ms['new']:.3f}" for name in others) + f" | {diff} |",
                      flush=True)


if __name__ == "__main__":
    main()
