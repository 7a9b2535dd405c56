"""Where a small eager training step's time goes, ours against FA2 (SDPA flash), for flashtile.bench.small_calls'
shapes: the GPU time of each kernel a step launches (profiler, mean of 20 steps), the host time of a step issued
back to back (per_call_us, no synchronization) and with a synchronization after every step, and the Python functions
of our forward and of ``ops.attention_backward`` on the calling thread (cProfile, top by own time). Run on the GPU:
``PYTHONPATH=.:scripts python scripts/small_step_probe.py [--cprofile]``."""
import argparse
import cProfile
import pstats

import torch
import torch.nn.functional as F
from profile_host import per_call_us
from step_profile import kernel_times

import flashtile
from flashtile import ops
from flashtile.bench.small_calls import SHAPES


def steps(batch, seqlen, nheads, head_dim, causal):
    q, k, v = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    dout_t = dout.transpose(1, 2)

    def ours():
        torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)

    def fa2():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        torch.autograd.grad(o, (qt, kt, vt), dout_t)
    return {"flashtile": ours, "FA2 (SDPA flash)": fa2}, (q, k, v, dout)


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
        peers, (q, k, v, dout) = steps(*shape)
        for name, step in peers.items():
            step()
            host = min(per_call_us(step, 500) for _ in range(3))
            sync = min(per_call_us(synced(step), 300) for _ in range(3))
            kernels = kernel_times(step, 20)
            listed = ", ".join(f"{n[:40]} {us:.1f}" for n, us in sorted(kernels.items(), key=lambda x: -x[1]))
            print("| " + " | ".join(map(str, shape[:4])) + f" | {'yes' if shape[4] else 'no'} | {name} | {host:.1f} | "
                  f"{sync:.1f} | {sum(kernels.values()):.1f} | {listed} |", flush=True)
        if args.cprofile and shape is SHAPES[0]:
            out, lse = flashtile.flash_attn_func(q.detach(), k.detach(), v.detach(), causal=shape[4],
                                                 return_attn_probs=True)[:2]
            calls = {
                "forward, inputs require grad": lambda: flashtile.flash_attn_func(q, k, v, causal=shape[4]),
                "ops.attention_backward": lambda: ops.attention_backward(
                    dout, q.detach(), k.detach(), v.detach(), out, lse, q.shape[-1] ** -0.5, (-1, 0), shape[4],
                    False),
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
