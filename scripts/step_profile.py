"""A training step's time against its kernels' (issue 36, item 3): forward + backward through autograd, eager, timed by
do_bench, beside the sum of the CUDA kernels the profiler records for one step, kernel by kernel.
Run on the GPU: ``PYTHONPATH=. python scripts/step_profile.py [--seqlens 1024 2048] [--head-dim 128]``."""
import argparse
import collections

import torch
import triton

import flashtile


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args(argv)
    d = args.head_dim
    print("| causal | N | fwd ms | fwd+bwd ms | kernels of one step, ms | step / kernels | kernels (µs each) |")
    print("|---|---|---|---|---|---|---|")
    for causal in (False, True):
        for n in args.seqlens:
            b, h = max(1, 16384 // n), 2048 // d
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn_like(q)

            def fwd():
                return flashtile.flash_attn_func(q, k, v, causal=causal)

            def step():
                torch.autograd.grad(fwd(), (q, k, v), dout)
            step()
            fwd_ms = triton.testing.do_bench(fwd, warmup=25, rep=100)
            step_ms = triton.testing.do_bench(step, warmup=25, rep=100)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            kernels = collections.defaultdict(float)
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    kernels[e.name] += e.device_time / 5 / 1000
            total = sum(kernels.values())
            names = ", ".join(f"{name[:40]} {ms * 1000:.0f}" for name, ms in sorted(kernels.items(),
                                                                                    key=lambda x: -x[1]))
            print(f"| {'yes' if causal else 'no'} | {n} | {fwd_ms:.3f} | {step_ms:.3f} | {total:.3f} | "
                  f"{step_ms / total:.2f} | {names} |", flush=True)


if __name__ == "__main__":
    main()
