"""``python -m flashtile.bench.lessons``: why FlashAttention-2 replaced FlashAttention-1, and why the
online softmax replaced the safe one, in time and in HBM bytes (closed forms, as flashtile.trace counts).

FlashAttention-1 reads K, V once and Q, O, m, l once per K/V tile (and writes O, m, l as often);
FlashAttention-2 reads Q once, K and V once per Q tile, writes O once. Softmax: the safe version reads x
three times, the online one twice; both write y once.
"""
import argparse
import math

import torch

from . import require_gpu
from .__main__ import bench_ms, fwd_flops


def attention_rows(seqlens, batch=4, nheads=16, head_dim=64, block=32, item=2):
    from .. import flash_attn_func
    from ..lessons.fa1 import flash_attn_v1
    rows = []
    for n in seqlens:
        q, k, v = (torch.randn(batch, n, nheads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        tiles = math.ceil(n / block)
        bh, qkv = batch * nheads, n * head_dim * item
        fa1_bytes = bh * (2 * qkv + tiles * (qkv + 2 * n * head_dim * 4 + 4 * n * 4))  # O, m, l in float32
        fa2_bytes = bh * (qkv + 2 * math.ceil(n / 64) * qkv + qkv + n * 4)
        for name, fn, nbytes in (("FlashAttention-1 (lesson)", lambda: flash_attn_v1(q, k, v), fa1_bytes),
                                 ("FlashAttention-2 (flashtile)", lambda: flash_attn_func(q, k, v), fa2_bytes)):
            ms = bench_ms(fn)
            rows.append(f"| {name} | {n} | {ms:.3f} | {fwd_flops(batch, nheads, n, n, head_dim, False) / ms / 1e9:.0f} "
                        f"| {nbytes / 2**20:.0f} |")
    return ["| kernel | N | ms | TFLOP/s | HBM MiB (closed form) |", "|---|---|---|---|---|"] + rows


def softmax_rows(shape=(8192, 8192)):
    from ..lessons.softmax import naive_softmax, online_softmax, safe_softmax
    x = torch.randn(*shape, device="cuda", dtype=torch.float32)
    size = x.numel() * 4
    rows = ["| softmax | reads of x | ms | GB/s counted |", "|---|---|---|---|"]
    for name, fn, reads in (("naive", naive_softmax, 2), ("safe", safe_softmax, 3), ("online", online_softmax, 2),
                            ("torch.softmax", lambda t: torch.softmax(t, -1), 1)):
        ms = bench_ms(lambda: fn(x))
        rows.append(f"| {name} | {reads} | {ms:.3f} | {(reads + 1) * size / ms / 1e6:.0f} |")
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashtile.bench.lessons", description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096])
    args = parser.parse_args(argv)
    require_gpu("python -m flashtile.bench.lessons")
    print("\n".join(attention_rows(args.seqlens)) + "\n\n" + "\n".join(softmax_rows()))


if __name__ == "__main__":
    main()
