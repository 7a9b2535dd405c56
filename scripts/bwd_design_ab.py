"""The sm90 backward with its shipped config against the same config with some fields changed, in one process,
taking turns (kernels/hopper/bwd.launch_bwd_hopper, every launch of it):

    PYTHONPATH=. python3 scripts/bwd_design_ab.py single_pass=1 --masks causal [--head-dims 64 128]
    PYTHONPATH=. python3 scripts/bwd_design_ab.py portable --masks full --seqlens 1024 2048
    PYTHONPATH=. python3 scripts/bwd_design_ab.py block_m=64 --masks --windows 256 1024 --head-dims 64

(``portable``: the variant is the portable backward, kernels/portable/bwd.py, as configs.BWD_BACKEND = "portable"
runs it. ``--windows``: causal sliding windows (W, 0) too, on the non-causal entry as dispatch takes them, FLOPs of
the pairs the window leaves.)

B·N = 16k tokens, H·D = 2048, bf16; backward TFLOP/s, do_bench medians, the median over turns; a markdown row per
shape, and the largest difference between the two versions' gradients.
"""
import argparse
import dataclasses
import functools

import torch
from bwd_ab import HIDDEN, TOKENS, median_ms

from flashtile import checks, configs, dispatch, ops
from flashtile.bench.__main__ import fwd_flops
from flashtile.kernels.hopper.bwd import launch_bwd_hopper


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fields", nargs="+", metavar="FIELD=INT", help="what the variant changes")
    parser.add_argument("--masks", nargs="*", default=["full", "causal"], choices=["full", "causal"])
    parser.add_argument("--windows", type=int, nargs="*", default=[], help="left sides W of causal windows (W, 0)")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    portable = args.fields == ["portable"]
    fields = {} if portable else {name: int(value) for name, value in (f.split("=") for f in args.fields)}
    print(f"| D | mask | N | shipped TFLOP/s | {' '.join(args.fields)} TFLOP/s | shipped / variant time | max diff |")
    print("|---|---|---|---|---|---|---|")
    masks = {mask: checks.window((-1, -1), mask == "causal") for mask in args.masks}  # flash-attn's (left, right)
    masks.update({f"window ({w}, 0)": (w, 0) for w in args.windows})
    for d in args.head_dims:
        for mask, window in masks.items():
            causal = dispatch.is_causal(window)
            shipped = configs.BWD_HOPPER[(d, causal)]
            versions = {"shipped": shipped, "variant": dataclasses.replace(shipped, **fields)}
            portable_config = dispatch.bwd_config(d, causal, 2, (9, 0), False)
            for n in args.seqlens:
                b, h = max(1, TOKENS // n), HIDDEN // d
                q, k, v, out, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(5))
                lse = torch.randn(b, h, n, device="cuda").abs() + n ** 0.5
                grads = {}

                def run(name):
                    if portable and name == "variant":
                        grads[name] = ops.attention_backward(dout, q, k, v, out, lse, d ** -0.5, window, True,
                                                             False, config=portable_config)
                        return
                    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                    launch_bwd_hopper(dout, q, k, v, out, lse, dq, dk, dv, d ** -0.5, window, True,
                                      config=versions[name])
                    grads[name] = (dq, dk, dv)
                ms = median_ms({name: functools.partial(run, name) for name in versions}, args.rounds)
                flops = 2.5 * fwd_flops(b, h, n, n, d, window if mask.startswith("window") else causal)
                diff = max((a.float() - c.float()).abs().max().item() for a, c in zip(grads["shipped"],
                                                                                       grads["variant"]))
                print(f"| {d} | {mask} | {n} | {flops / ms['shipped'] * 1e-9:.0f} | "
                      f"{flops / ms['variant'] * 1e-9:.0f} | {ms['shipped'] / ms['variant']:.3f} | {diff:.2g} |",
                      flush=True)


if __name__ == "__main__":
    main()
