"""q, k, v sliced out of one packed qkv (flash_attn_qkvpacked_func's layout, and SDPA's on a fused projection):
flash_attn_qkvpacked_func, whose dqkv is the buffer the kernels wrote (run 51), against the same slices passed to
flash_attn_func (autograd stacks their gradients into dqkv: what the packed call did before), against the same call on
separate contiguous q, k, v, and against PyTorch's SDPA (FA2) on the fused layout; forward + backward, bf16, do_bench
medians, turns taken in one process (bwd_ab.median_ms).

    PYTHONPATH=. python3 scripts/packed_layout_ab.py [--turns 3]
"""
import argparse

import torch
import torch.nn.functional as F
from bwd_ab import median_ms

import flashtile


def step(fn, inputs, dout):
    def run():
        for t in inputs:
            t.grad = None
        fn().backward(dout)
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    print("| D | causal | N | row | ms (median of turns) | TFLOP/s |\n|---|---|---|---|---|---|")
    for head_dim in (64, 128):
        for causal in (False, True):
            for seqlen in (2048, 8192):
                batch, nheads = 16384 // seqlen, 2048 // head_dim
                qkv = torch.randn(batch, seqlen, 3, nheads, head_dim, device="cuda", dtype=torch.bfloat16,
                                  requires_grad=True)
                q, k, v = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))
                dout = torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
                fused = qkv.detach().permute(2, 0, 3, 1, 4).requires_grad_()  # (3, batch, nheads, seqlen, head_dim)
                rows = {
                    "packed": step(lambda: flashtile.flash_attn_qkvpacked_func(qkv, causal=causal), [qkv], dout),
                    "packed, gradients stacked": step(lambda: flashtile.flash_attn_func(*qkv.unbind(2), causal=causal),
                                                      [qkv], dout),
                    "separate q, k, v": step(lambda: flashtile.flash_attn_func(q, k, v, causal=causal), [q, k, v],
                                             dout),
                    "SDPA (FA2), fused layout": step(lambda: F.scaled_dot_product_attention(
                        *fused, is_causal=causal).transpose(1, 2), [fused], dout),
                }
                ms = median_ms(rows, args.turns)
                flops = 4 * batch * nheads * seqlen * seqlen * head_dim * 3.5 / (2 if causal else 1)
                for name, m in ms.items():
                    print(f"| {head_dim} | {causal} | {seqlen} | {name} | {m:.3f} | {flops / m / 1e9:.0f} |",
                          flush=True)

if __name__ == "__main__":
    main()
