"""Eager training steps at short sequences: forward + backward through autograd, timed with do_bench, by the path
eager calls take (ops._Attention) and by the custom op torch.compile traces (ops.fwd), in one process; and the host
time of one step (no synchronization). Run on the GPU: ``PYTHONPATH=. python scripts/step_host.py``."""
import time
from unittest import mock

import torch
import triton

import flashtile


def main():
    print("| causal | N | B×H | path | step ms (do_bench) | host ms per step |")
    print("|---|---|---|---|---|---|")
    for causal in (False, True):
        for n in (1024, 2048):
            b, h, d = 16384 // n, 16, 128
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn_like(q)

            def step():
                torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
            for path in ("autograd.Function", "custom op"):
                with mock.patch("torch.compiler.is_compiling", return_value=path == "custom op"):
                    step()
                    ms = triton.testing.do_bench(step, warmup=25, rep=100)
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(20):
                        step()
                    host = (time.perf_counter() - start) / 20
                    torch.cuda.synchronize()
                print(f"| {'yes' if causal else 'no'} | {n} | {b}×{h} | {path} | {ms:.3f} | {host * 1e3:.3f} |",
                      flush=True)


if __name__ == "__main__":
    main()
