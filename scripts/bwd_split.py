"""Where the sm90 backward's time goes: delta, the Gluon dK/dV kernel (per ring depth), the portable dQ
programs (per tile config), the portable one-launch backward and the whole sm90 backward; D=128 bf16,
B·N = 16k, 16 heads.
Run on the GPU: ``PYTHONPATH=. python scripts/bwd_split.py``."""
import dataclasses
import math

import torch
import triton

from flashtile import configs, dispatch
from flashtile.kernels.hopper.bwd import flash_bwd_dkdv_hopper_kernel, launch_args, launch_bwd_hopper
from flashtile.kernels.portable.bwd import launch_bwd, launch_preprocess
from flashtile.ops import attention_forward

DQ_CANDIDATES = [configs.from_fields(configs.BwdConfig, (64, 64, m2, n2, warps, stages, "none"))
                 for m2, n2, warps, stages in ((64, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 3), (128, 128, 8, 2))]


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def main():
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}: backward pieces, ms (TFLOP/s of the piece's own products)\n")
    print("| causal | N | delta | dK/dV x2 | x3 | x4 | dQ 64x64 | dQ 128x64 | dQ 64x128 | dQ 128x128 | portable "
          "| hopper |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for causal in (False, True):
        for n in (2048, 4096, 16384):
            b, h, d = 16384 // n, 16, 128
            q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            scale = 1 / math.sqrt(d)
            window = (-1, 0) if causal else (-1, -1)
            out = torch.empty_like(q)
            out, lse = attention_forward(q, k, v, scale, window, True, out)
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            pair = 2 * b * h * n * n * d / (2 if causal else 1)  # FLOPs of one [N, N] x D product
            cells = [f"{ms(lambda: launch_preprocess(out, do, lse, None, n)):.3f}"]
            delta = launch_preprocess(out, do, lse, None, n)
            for stages in (2, 3, 4):
                cfg = dataclasses.replace(configs.BWD_HOPPER[(128, causal)], num_stages=stages)
                grid, args, kwargs = launch_args(q, k, v, do, dk, dv, lse, delta, scale, causal, True, cfg)
                try:
                    t = ms(lambda: flash_bwd_dkdv_hopper_kernel[grid](*args, **kwargs))
                    cells.append(f"{t:.3f} ({4 * pair / t / 1e9:.0f})")
                except Exception as e:  # noqa: BLE001 - a depth that does not fit is a cell, not a stop
                    cells.append(type(e).__name__)
            for cfg in DQ_CANDIDATES:
                t = ms(lambda: launch_bwd(do, q, k, v, out, lse, dq, dk, dv, None, None, None, None, scale, window,
                                          True, True, cfg, delta=delta, dkdv=False))
                cells.append(f"{t:.3f} ({3 * pair / t / 1e9:.0f})")
            cfg = dispatch.bwd_config(128, causal, 2, (9, 0), False)
            t = ms(lambda: launch_bwd(do, q, k, v, out, lse, dq, dk, dv, None, None, None, None, scale, window,
                                      True, False, cfg))
            cells.append(f"{t:.3f} ({5 * pair / t / 1e9:.0f})")
            t = ms(lambda: launch_bwd_hopper(do, q, k, v, out, lse, dq, dk, dv, scale, causal, True))
            cells.append(f"{t:.3f} ({5 * pair / t / 1e9:.0f})")
            print(f"| {'yes' if causal else 'no'} | {n} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
