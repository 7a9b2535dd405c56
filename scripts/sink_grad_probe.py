"""Where the sinks' gradient's error comes from on the GPU (a GPU-tier failure of test_sinks_gradients, run 50):
for several seeds, the kernel's d loss / d sink against float64, against PyTorch's own in the inputs' dtype, and
against the same formula, −Σ exp(sink − lse_i) · rowsum(dO ∘ O)_i, evaluated in float64 on the kernel's own O and
LSE (so a wrong sum shows apart from a wrong O or LSE). ``PYTHONPATH=. python scripts/sink_grad_probe.py``."""
import argparse

import torch

import flashtile
from flashtile import reference


def probe(seed, batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal, deterministic):
    torch.manual_seed(seed)
    q = torch.randn(batch, seqlen_q, nheads, head_dim, device="cuda").to(dtype)
    k, v = (torch.randn(batch, seqlen_k, nheads_k, head_dim, device="cuda").to(dtype) for _ in range(2))
    sinks = torch.randn(nheads, device="cuda") * 2
    dout = torch.randn(batch, seqlen_q, nheads, head_dim, device="cuda").to(dtype)

    def grad(fn, upcast=False):
        s = (sinks.double() if upcast else sinks).clone().requires_grad_()
        out, lse = fn(s)
        (out.double() * dout.double()).sum().backward()
        return s.grad.double(), out, lse
    ours, out, lse = grad(lambda s: flashtile.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic,
                                                               return_attn_probs=True, learnable_sink=s)[:2])
    want, _, ref_lse = grad(lambda s: reference.attention(q, k, v, causal=causal, sinks=s), True)
    base, _, _ = grad(lambda s: reference.attention(q, k, v, causal=causal, sinks=s, upcast=False))
    delta = (out.double() * dout.double()).sum(-1).transpose(1, 2)  # [batch, nheads, seqlen_q]
    share = torch.exp(sinks.double()[None, :, None] - lse.double())
    formula = -(share * delta).sum((0, 2))
    err = lambda a, b: (a - b).abs().max().item()  # noqa: E731
    return (f"| {seed} | {err(ours, want):.2e} | {err(base, want):.2e} | {err(formula, want):.2e} | "
            f"{err(ours, formula):.2e} | {err(lse.double(), ref_lse.double()):.2e} | {want.abs().max().item():.3f} |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=12)
    args = parser.parse_args()
    cases = {"bf16 2x1024x1024 h8/2 d64 full": (2, 1024, 1024, 8, 2, 64, torch.bfloat16, False, False),
             "fp16 1x700x1500 h4/4 d64 full deterministic": (1, 700, 1500, 4, 4, 64, torch.float16, False, True),
             "bf16 2x1024x1024 h8/2 d128 causal": (2, 1024, 1024, 8, 2, 128, torch.bfloat16, True, False)}
    for name, case in cases.items():
        print(f"\n{name}\n\n| seed | ours | PyTorch's | formula on our O, LSE | ours − formula | LSE | max dsink |")
        print("|---|---|---|---|---|---|---|")
        for seed in range(args.seeds):
            print(probe(seed, *case), flush=True)


if __name__ == "__main__":
    main()
