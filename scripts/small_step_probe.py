"""Where a small eager training step's time goes, ours against the peers of flashtile.bench.small_calls (its calls and
shapes): the GPU time of each kernel a step launches (profiler, mean of 20 steps), the host time of a step issued
back to back (per_call_us, no synchronization) and with a synchronization after every step, and the Python functions
of our forward and of ``ops.attention_backward`` on the calling thread (cProfile, top by own time). Run on the GPU:
``PYTHONPATH=.:scripts python scripts/small_step_probe.py [--cprofile]``."""
import argparse
import cProfile
import pstats

import torch
from profile_host import per_call_us
from step_profile import kernel_times

import flashtile
from flashtile import ops
from flashtile.bench.small_calls import SHAPES, peers


def synced(fn):
    def run():
        fn()
        torch.cuda.synchronize()
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    print("| B | N | H | D | causal | peer | host µs a step | synced µs a step | kernels µs a step | kernels |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for name, step in peers(*shape, backward=True).items():
            try:
                step()
            except RuntimeError:  # (cuDNN refuses one key)
                continue
            host = min(per_call_us(step, 500) for _ in range(3))
            sync = min(per_call_us(synced(step), 300) for _ in range(3))
            kernels = kernel_times(step, 20)
            listed = ", ".join(f"{n[:40]} {us:.1f}" for n, us in sorted(kernels.items(), key=lambda x: -x[1]))
            print("| " + " | ".join(map(str, shape[:4])) + f" | {'yes' if shape[4] else 'no'} | {name} | {host:.1f} | "
                  f"{sync:.1f} | {sum(kernels.values()):.1f} | {listed} |", flush=True)
        if args.cprofile and shape is SHAPES[0]:
            profile_ours(*shape)


def profile_ours(batch, seqlen, nheads, head_dim, causal):
    """cProfile, top by own time, of our forward on inputs that need a gradient and of ops.attention_backward."""
    q, k, v, dout = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    out, lse = flashtile.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[:2]
    grad_q, grad_k, grad_v = (t.clone().requires_grad_() for t in (q, k, v))
    calls = {
        "forward, inputs require grad": lambda: flashtile.flash_attn_func(grad_q, grad_k, grad_v, causal=causal),
        "ops.attention_backward": lambda: ops.attention_backward(dout, q, k, v, out, lse, head_dim ** -0.5, (-1, 0)
                                                                 if causal else (-1, -1), True, False),
    }
    for what, fn in calls.items():
        for _ in range(50):
            fn()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(1000):
            fn()
        profile.disable()
        print(f"\n{what}, 1000 calls:")
        pstats.Stats(profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
