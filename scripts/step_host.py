"""Eager training steps at short sequences: forward + backward through autograd, timed with do_bench, by the path
eager calls take (ops._Attention), by the custom op torch.compile traces (ops.fwd) and by the eager path with the
portable backward (configs.BWD_BACKEND = "portable"), in one process; and the host time of one step (no
synchronization). B·N = 16k tokens, H·D = 2048. Run on the GPU:
``PYTHONPATH=. python scripts/step_host.py [--seqlens 512 1024] [--head-dim 128]``."""
import argparse
import time
from unittest import mock

import torch
import triton

import flashtile
from flashtile import configs

PATHS = ("autograd.Function", "custom op", "portable backward")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args(argv)
    print("| causal | N | B×H | path | step ms (do_bench) | host ms per step |")
    print("|---|---|---|---|---|---|")
    for causal in (False, True):
        for n in args.seqlens:
            b, h, d = max(1, 16384 // n), 2048 // args.head_dim, args.head_dim
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn_like(q)

            def step():
                torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
            for path in PATHS:
                backend = "portable" if path == "portable backward" else configs.BWD_BACKEND
                with mock.patch("torch.compiler.is_compiling", return_value=path == "custom op"), \
                        mock.patch.object(configs, "BWD_BACKEND", backend):
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
