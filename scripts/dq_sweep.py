"""Tile sweep of the dQ kernels that run before the sm90 dK/dV kernel (each writing delta as well): the portable
Q-tile programs (no atomics) and the Gluon dQ kernel (kernels/hopper/bwd_dq.py); D=128 bf16, B·N = 16k,
16 heads. Each Gluon cell also checks dQ and delta against the portable programs' (max error / max value).
The winners go to configs.BWD_HOPPER. Run on the GPU: ``PYTHONPATH=. python scripts/dq_sweep.py [--portable]``
(``--portable``: every portable candidate, not only the two in configs)."""
import math
import sys

import torch
import triton

from flashtile.configs import BwdConfig, HopperDqConfig
from flashtile.kernels.hopper.bwd_dq import launch_dq_hopper
from flashtile.kernels.portable.bwd import launch_bwd
from flashtile.ops import attention_forward

# (block_m2, block_n2, num_warps, num_stages); the K/V-tile fields are unused with dkdv=False
PORTABLE = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 32, 4, 3), (64, 32, 4, 4), (64, 64, 8, 3),
            (64, 128, 4, 2), (128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 8, 3), (128, 32, 4, 3), (128, 64, 4, 2),
            (128, 128, 8, 2)]
PORTABLE_IN_CONFIGS = [(64, 64, 4, 3), (128, 64, 8, 3)]
GLUON = [HopperDqConfig(block_m=128, block_n=64, num_stages=2), HopperDqConfig(block_m=128, block_n=64, num_stages=3),
         HopperDqConfig(block_m=128, block_n=128, num_stages=2)]


def main():
    torch.manual_seed(0)
    seqlens = (2048, 4096, 16384)
    portable = PORTABLE if "--portable" in sys.argv else PORTABLE_IN_CONFIGS
    print(f"{torch.cuda.get_device_name()}: dQ kernels writing delta, ms (TFLOP/s of their 3 products)"
          " [Gluon: error of dQ, delta against the first portable row]\n")
    print("| causal | dQ kernel | " + " | ".join(f"N={n}" for n in seqlens) + " |")
    print("|---|---|" + "---|" * len(seqlens))
    for causal in (False, True):
        data = []
        for n in seqlens:
            b, h, d = 16384 // n, 16, 128
            q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            window = (-1, 0) if causal else (-1, -1)
            out, lse = attention_forward(q, k, v, 1 / math.sqrt(d), window, True, torch.empty_like(q))
            data.append((q, k, v, do, out, lse, 2 * b * h * n * n * d / (2 if causal else 1), {}))
        runs = [(f"portable {m2}x{n2}, {w} warps, {st} stages",
                 BwdConfig(block_m1=64, block_n1=64, block_m2=m2, block_n2=n2, num_warps=w, num_stages=st,
                           dq_atomic="none"))
                for m2, n2, w, st in portable]
        runs += [(f"Gluon {c.block_m}x{c.block_n}, {c.num_stages} stages", c) for c in GLUON]
        for label, cfg in runs:
            cells = []
            for q, k, v, do, out, lse, pair, ref in data:
                dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
                delta = torch.full_like(lse, float("nan"))
                scale = 1 / math.sqrt(q.shape[-1])
                if isinstance(cfg, BwdConfig):
                    def fn():
                        launch_bwd(do, q, k, v, out, lse, dq, dk, dv, None, None, None, None, scale,
                                   (-1, 0) if causal else (-1, -1), True, True, cfg, delta=delta, dkdv=False,
                                   write_delta=True)
                else:
                    def fn():
                        launch_dq_hopper(do, q, k, v, out, lse, dq, delta, scale, causal, True, cfg)
                try:
                    fn()
                    torch.cuda.synchronize()
                    check = ""
                    if not ref:
                        ref.update(dq=dq.clone(), delta=delta.clone())
                    else:
                        err_dq = ((dq.float() - ref["dq"].float()).abs().max() / ref["dq"].float().abs().max()).item()
                        err_d = ((delta - ref["delta"]).abs().max() / ref["delta"].abs().max()).item()
                        check = f" [{err_dq:.1e}, {err_d:.1e}]"
                    t = triton.testing.do_bench(fn, warmup=25, rep=100)
                    cells.append(f"{t:.3f} ({3 * pair / t / 1e9:.0f}){check}")
                except Exception as e:  # noqa: BLE001 - a config that does not fit is a cell, not a stop
                    cells.append(type(e).__name__)
            print(f"| {'yes' if causal else 'no'} | {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
