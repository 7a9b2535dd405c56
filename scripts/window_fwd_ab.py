"""The forward under causal sliding windows (W, 0): the portable kernel against the sm90 kernel's shipped entry of
the head dim and candidate entries, for the windows configs.FWD_HOPPER's ``min_window`` leaves to the portable kernel
(docs/configs.md#fwd_hopper-windows). D=64: the shipped 192-row entry (three warpgroups, no FROZEN_MAX under a
window) and a 128-row entry of two warpgroups (FROZEN_MAX under a window, fwd_schedule.uses_frozen_max); D=128: the
shipped entry and 64-key tiles (fewer masked keys at a window's edges). With ``--softcap``, capped scores (the
entries' ``softcap`` flag, False at D=64, is what this measures; a window of 0 is plain causal attention and its
entries). bf16, B·N = 16k, H·D = 2048, forward TFLOP/s of the pairs the window leaves, do_bench medians, turns taken
in one process (bwd_ab.median_ms).

    PYTHONPATH=.:scripts python3 scripts/window_fwd_ab.py [--turns 3] [--seqlen 8192] [--windows 256 1024 4096]
    PYTHONPATH=.:scripts python3 scripts/window_fwd_ab.py --softcap 50 --windows 0 --seqlen 4096
"""
import argparse
import dataclasses

import torch
from bwd_ab import median_ms

from flashtile import configs, ops
from flashtile.bench.__main__ import fwd_flops


def candidates(head_dim, causal=False):
    """{name: config} of the head dim's entry (non-causal: the one a window takes), opened to every window."""
    shipped = dataclasses.replace(configs.FWD_HOPPER[(head_dim, causal)], min_window=0, min_seqlen_q=0, below=None)
    rows = {"portable": configs.FWD_SM90[(head_dim, causal)], "sm90 shipped": shipped}
    if head_dim == 64:
        rows["sm90 128 rows, FROZEN_MAX"] = configs.HopperFwdConfig(
            block_m=128, block_n=128, num_stages=3, pingpong=False, persistent=True, frozen_max=True)
    else:
        rows["sm90 64-key tiles"] = dataclasses.replace(shipped, block_n=64, num_stages=3, o_kstage=False)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--windows", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096],
                        help="left sides W of causal windows (W, 0); 0: plain causal attention")
    parser.add_argument("--softcap", type=float, default=0.0, help="flash-attn's softcap (0: none)")
    args = parser.parse_args()
    print("| D | window | N | config | ms (median of turns) | TFLOP/s |\n|---|---|---|---|---|---|")
    seqlen = args.seqlen
    for head_dim in (64, 128):
        batch, nheads = max(16384 // seqlen, 1), 2048 // head_dim
        q, k, v = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        for width in args.windows:
            window = (width, 0) if width > 0 else (-1, 0)
            runs = {name: (lambda c=config: ops.attention_forward(q, k, v, head_dim ** -0.5, window, True, config=c,
                                                                  softcap=args.softcap))
                    for name, config in candidates(head_dim, width == 0).items()}
            flops = fwd_flops(batch, nheads, seqlen, seqlen, head_dim, window)
            for name, ms in median_ms(runs, args.turns).items():
                print(f"| {head_dim} | {window} | {seqlen} | {name} | {ms:.3f} | {flops / ms / 1e9:.0f} |",
                      flush=True)


if __name__ == "__main__":
    main()
