"""The portable backward (kernels/portable/bwd.py) against another version of that file, in one process, taking turns.

    python3 scripts/bwd_ab.py --old path/to/old/bwd.py [--rounds 5]

The old file is loaded as a module of flashtile.kernels.portable (its relative imports resolve there), so only bwd.py
may differ. Each shape times both launch_bwd's with the shipped tile config (dispatch.bwd_config), rounds turns each,
do_bench medians; prints a markdown table, the median over turns of old / new per shape, and checks dQ, dK, dV of
the two agree.
"""
import argparse
import importlib.util
import statistics
import sys

import torch
import triton

from flashtile import dispatch, ops
from flashtile.kernels.common.tiles import head_dim_pad
from flashtile.kernels.portable import bwd as new_bwd

TOKENS, HIDDEN = 16384, 2048


def load_old(path, name="_bwd_old", package="flashtile.kernels.portable"):
    """The file at ``path`` as the module <package>.<name> (its relative imports resolve there)."""
    spec = importlib.util.spec_from_file_location(f"{package}.{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def median_ms(runs, rounds, warmup=25, rep=100, after=None):
    """{name: median over ``rounds`` turns of do_bench's median ms} of ``runs`` {name: fn}, each called once first
    (compile, allocate); each turn runs them all, in an order that moves by one each turn; ``after(name)`` (if given)
    right after each timing."""
    names = list(runs)
    times = {name: [] for name in names}
    for name in names:
        runs[name]()
    for turn in range(rounds):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            times[name].append(triton.testing.do_bench(runs[name], warmup=warmup, rep=rep, return_mode="median"))
            if after:
                after(name)
    return {name: statistics.median(t) for name, t in times.items()}



def median_us_under(step, contexts, rounds, calls):
    """{name: median over ``rounds`` turns of µs per call of ``calls`` back-to-back calls of ``step``} with each of
    ``contexts`` {name: context manager factory} entered for its whole turn, in an order that moves by one each turn
    (flashtile.bench.small_calls.per_call_us)."""
    from flashtile.bench.small_calls import per_call_us
    names = list(contexts)
    seen = {name: [] for name in names}
    for turn in range(rounds):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            with contexts[name]():
                seen[name].append(per_call_us(step, calls, torch.cuda.synchronize))
    return {name: statistics.median(v) for name, v in seen.items()}

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shapes", nargs="+", default=["64:1024", "64:4096", "64:16384", "128:1024"],
                        help="head_dim:seqlen")
    args = parser.parse_args()
    old_bwd = load_old(args.old)
    print("| D | causal | N | new ms | old ms | old / new (medians of turns) |\n|---|---|---|---|---|---|")
    for shape in args.shapes:
        d, n = map(int, shape.split(":"))
        for causal in (False, True):
            b, h = TOKENS // n, HIDDEN // d
            q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            window = (-1, 0) if causal else (-1, -1)
            out, lse = ops.attention_forward(q, k, v, d ** -0.5, window, True)
            cfg = dispatch.bwd_config(head_dim_pad(d), causal, 2, (9, 0), False)
            grads = {name: [torch.empty_like(t) for t in (q, k, v)] for name in ("new", "old")}
            delta = ops.launch_preprocess(out, dout, lse, None, n)[0]

            def run(module, name):
                return lambda: module.launch_bwd(dout, q, k, v, out, lse, *grads[name], None, None, None, None,
                                                 d ** -0.5, window, True, False, cfg, delta)
            runs = {"new": run(new_bwd, "new"), "old": run(old_bwd, "old")}
            ms = median_ms(runs, args.rounds)
            for a, b_ in zip(grads["new"], grads["old"]):
                assert (a.float() - b_.float()).abs().max().item() <= 1e-2 * b_.float().abs().max().item() + 1e-3
            print(f"| {d} | {causal} | {n} | {ms['new']:.3f} | {ms['old']:.3f} | {ms['old'] / ms['new']:.4f} |",
                  flush=True)


if __name__ == "__main__":
    main()
