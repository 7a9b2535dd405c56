"""The sm90 backward under candidate configs (configs.HopperBwdConfig) against the portable backward, taking turns;
bf16, B·N = 16k, H·D = 2048; each candidate's gradients checked against the first's.
Run on the GPU: ``PYTHONPATH=. python scripts/bwd_hopper_sweep.py [--head-dims 64 256] [--json PATH]``."""
import argparse
import dataclasses
import json
import math

import torch
import triton

from flashtile import checks, configs
from flashtile.configs import HopperBwdConfig, HopperDqConfig
from flashtile.kernels.hopper.bwd import launch_bwd_hopper
from flashtile.ops import attention_backward, attention_forward

SPLIT = dict(block_n=64, split_gradients=True)
CANDIDATES = {
    64: {
        "one pass, 128 rows a step": configs.BWD_HOPPER[(64, False)],
        "one pass, 64 rows, ring 3": HopperBwdConfig(num_stages=3, dq_hopper=HopperDqConfig(block_n=128),
                                                     single_pass=True),
        "one pass, 64 rows, ring 2": HopperBwdConfig(dq_hopper=HopperDqConfig(block_n=128), single_pass=True),
    },
    128: {
        "two kernels": dataclasses.replace(configs.BWD_HOPPER[(128, False)], single_pass=False),
        "one pass": configs.BWD_HOPPER[(128, False)],
    },
    256: {
        "64 rows a step, ring 2": HopperBwdConfig(dq_hopper=HopperDqConfig(block_n=32), **SPLIT),
        "32 rows a step, ring 4": HopperBwdConfig(block_m=32, num_stages=4, dq_hopper=HopperDqConfig(block_n=32),
                                                  **SPLIT),
        "32 rows a step, ring 2": HopperBwdConfig(block_m=32, dq_hopper=HopperDqConfig(block_n=32), **SPLIT),
    },
}


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--seqlens", type=int, nargs="+")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    print(f"{torch.cuda.get_device_name()}: backward ms (TFLOP/s at 2.5x the forward's FLOPs), best of {args.rounds}"
          " turns; err: gradients' largest relative error against the first candidate\n")
    for d in args.head_dims:
        names = ["portable"] + list(CANDIDATES[d])
        print("| D | causal | N | " + " | ".join(names) + " | err |")
        print("|---" * (len(names) + 4) + "|")
        for causal in (False, True):
            window = checks.window((-1, -1), causal)
            for n in args.seqlens or (1024, 4096, 16384):
                b, h = max(1, 16384 // n), 2048 // d
                q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                scale = 1 / math.sqrt(d)
                window = (-1, 0) if causal else (-1, -1)
                out, lse = attention_forward(q, k, v, scale, window, True, torch.empty_like(q))
                grads = {name: tuple(torch.empty_like(t) for t in (q, k, v)) for name in names[1:]}

                def portable():
                    configs.BWD_BACKEND = "portable"
                    try:
                        return attention_backward(do, q, k, v, out, lse, scale, window, True, False)
                    finally:
                        configs.BWD_BACKEND = "auto"

                def runner(name):
                    if name == "portable":
                        return portable
                    return lambda: launch_bwd_hopper(do, q, k, v, out, lse, *grads[name], scale, window, True,
                                                     config=CANDIDATES[d][name])
                best = {name: math.inf for name in names}
                for turn in range(args.rounds):
                    for name in names[turn % len(names):] + names[:turn % len(names)]:
                        best[name] = min(best[name], ms(runner(name)))
                first = grads[names[1]]
                err = max(rel_err(g, f) for name in names[2:] for g, f in zip(grads[name], first)) \
                    if len(names) > 2 else 0.0
                err = max(err, max(rel_err(g, f) for g, f in zip(portable(), first)))
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
                rows.append(dict(head_dim=d, causal=causal, seqlen=n, batch=b, nheads=h, ms=best, err=err))
                print(f"| {d} | {'yes' if causal else 'no'} | {n} | "
                      + " | ".join(f"{best[x]:.3f} ({flops / best[x] / 1e9:.0f})" for x in names)
                      + f" | {err:.1e} |", flush=True)
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
