"""The sm90 backward's two designs side by side (configs.HopperBwdConfig.single_pass): two kernels (dQ, then dK/dV,
S and P computed in each) against one pass (dK/dV handing dS·K to the copy engine, which adds it into a float32 dQ),
the whole backward and
the single pass's pieces, taking turns; bf16, B·N = 16k, H·D = 2048.
Run on the GPU: ``PYTHONPATH=. python scripts/bwd_single_pass.py [--head-dims 128] [--seqlens ...] [--json PATH]``."""
import argparse
import dataclasses
import json
import math

import torch
import triton

from flashtile import checks, configs
from flashtile.kernels.hopper.bwd import dq_acc_shape, flash_bwd_dkdv_hopper_kernel, launch_args, launch_bwd_hopper
from flashtile.kernels.portable.bwd import launch_dq_cast, launch_preprocess
from flashtile.ops import attention_forward


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dims", type=int, nargs="+", default=[128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    print(f"{torch.cuda.get_device_name()}: sm90 backward, ms (TFLOP/s at 2.5x the forward's FLOPs), best of "
          f"{args.rounds} turns\n")
    print("| D | causal | N | two kernels | single pass | speed-up | preprocess + zero | dK/dV + dQ reduce | cast |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in args.head_dims:
        for causal in (False, True):
            window = checks.window((-1, -1), causal)
            for n in args.seqlens:
                b, h = max(1, 16384 // n), 2048 // d
                q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                scale = 1 / math.sqrt(d)
                out, lse = attention_forward(q, k, v, scale, (-1, 0) if causal else (-1, -1), True,
                                             torch.empty_like(q))
                dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
                shipped = configs.BWD_HOPPER[(d, causal)]
                designs = {"two": dataclasses.replace(shipped, single_pass=False),
                           "single": dataclasses.replace(shipped, single_pass=True)}
                best = {name: math.inf for name in designs}
                for turn in range(args.rounds):
                    for name in list(designs)[turn % 2:] + list(designs)[:turn % 2]:
                        best[name] = min(best[name], ms(lambda: launch_bwd_hopper(
                            do, q, k, v, out, lse, dq, dk, dv, scale, window, True, False, designs[name])))
                cfg = designs["single"]
                delta, acc, _ = launch_preprocess(out, do, lse, None, n, zeroed=dq_acc_shape(q, cfg))
                grid, kargs, kwargs = launch_args(q, k, v, do, dk, dv, lse, delta, scale, window, True, cfg,
                                                        acc)
                pieces = [ms(lambda: launch_preprocess(out, do, lse, None, n, zeroed=dq_acc_shape(q, cfg))),
                          ms(lambda: flash_bwd_dkdv_hopper_kernel[grid](*kargs, **kwargs)),
                          ms(lambda: launch_dq_cast(acc, dq, scale))]
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
                row = dict(head_dim=d, causal=causal, seqlen=n, batch=b, nheads=h, two_ms=best["two"],
                           single_ms=best["single"], pieces_ms=pieces,
                           two_tflops=flops / best["two"] / 1e9, single_tflops=flops / best["single"] / 1e9)
                rows.append(row)
                print(f"| {d} | {'yes' if causal else 'no'} | {n} | {best['two']:.3f} ({row['two_tflops']:.0f}) | "
                      f"{best['single']:.3f} ({row['single_tflops']:.0f}) | {best['two'] / best['single']:.2f} | "
                      + " | ".join(f"{t:.3f}" for t in pieces) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
