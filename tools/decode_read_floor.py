"""The read floor of a decode step: a kernel that only streams the KV cache through TMA tiles (no attention), in
three shapes of tile, against the shipped decode and cuDNN in the same process. The cache is (B, L, 8, 128) in one
of two layouts (--layout): key-major (flash-attn's, contiguous; one key of one head is 256 contiguous bytes, one key
of all eight heads 2 KB) or head-major (SDPA's (B, 8, L, 128) contiguous, seen through a transpose: each head's keys
contiguous, as the decode bench and probe hand it to both kernels).

    PYTHONPATH=. python tools/decode_read_floor.py [--batches 8 32] [--seqlens 32768 131072] [--layout key head]

Patterns "floor {heads}h×{keys}k/{boxes}box s{stages} p{programs} w{warps}" (--patterns, six numbers each): the keys
split to make that many programs; by default (run 33) 256 programs, each step 64 KB of K and V: 128 keys of one head
(the shipped decode's tiles), 32 keys of four heads (1 KB rows), 16 keys of all eight (2 KB rows) as one TMA box or
as eight boxes of one head; a ring of 2 stages (two programs an SM) or 3.
"""
import argparse
import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

PATTERNS = [1, 128, 1, 2, 256, 4, 4, 32, 1, 2, 256, 4, 8, 16, 1, 2, 256, 4, 8, 16, 8, 2, 256, 4, 8, 16, 1, 3, 256, 4,
            8, 16, 8, 3, 256, 4]  # run 33, call 5


@triton.jit
def read_floor_kernel(K, V, Out, seqlen, HEAD_GROUPS: tl.constexpr, HEADS: tl.constexpr, BLOCK_N: tl.constexpr,
                      HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr, STAGES: tl.constexpr, BOXES: tl.constexpr):
    """Program (batch, head group, split) reads its keys' K and V tiles and keeps their elementwise max; a tile of
    HEADS heads comes as one TMA box, or (BOXES > 1) as BOXES boxes of HEADS // BOXES heads each."""
    pid = tl.program_id(0)
    split = pid % SPLITS
    h = (pid // SPLITS) % HEAD_GROUPS * HEADS
    b = pid // SPLITS // HEAD_GROUPS
    chunk = seqlen // SPLITS
    acc = tl.full([BLOCK_N * HEADS // BOXES, HEAD_DIM], float("-inf"), K.dtype)
    for start_n in tl.range(split * chunk, split * chunk + chunk, BLOCK_N, num_stages=STAGES):
        for i in tl.static_range(BOXES):
            k = K.load([b, start_n, h + i * (HEADS // BOXES), 0]).reshape(BLOCK_N * HEADS // BOXES, HEAD_DIM)
            v = V.load([b, start_n, h + i * (HEADS // BOXES), 0]).reshape(BLOCK_N * HEADS // BOXES, HEAD_DIM)
            acc = tl.maximum(acc, tl.maximum(k, v)).to(K.dtype)
    tl.store(Out + pid, tl.max(tl.max(acc.to(tl.float32), 1), 0))


def floor_fn(k_cache, v_cache, heads, block_n, stages, warps, boxes=1, programs=256):
    """(the launch, its output: one max per program, programs ordered (batch, head group, split))."""
    batch, seqlen, nheads_k, head_dim = k_cache.shape
    splits = max(1, programs // (batch * nheads_k // heads))
    descs = [TensorDescriptor.from_tensor(t, [1, block_n, heads // boxes, head_dim]) for t in (k_cache, v_cache)]
    grid = (batch * nheads_k // heads * splits,)
    out = torch.empty(grid[0], device=k_cache.device)
    return functools.partial(read_floor_kernel[grid], *descs, out, seqlen, HEAD_GROUPS=nheads_k // heads, HEADS=heads,
                             BLOCK_N=block_n, HEAD_DIM=head_dim, SPLITS=splits, STAGES=stages, BOXES=boxes,
                             num_warps=warps), out


def cache(batch, seqlen, layout, nheads_k=8, head_dim=128, device="cuda", dtype=torch.bfloat16):
    """A random (batch, seqlen, nheads_k, head_dim) cache, key-major (contiguous) or head-major (a transposed view)."""
    if layout == "key":
        return torch.randn(batch, seqlen, nheads_k, head_dim, device=device, dtype=dtype)
    return torch.randn(batch, nheads_k, seqlen, head_dim, device=device, dtype=dtype).transpose(1, 2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[32768, 131072])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--patterns", type=int, nargs="+", default=PATTERNS,
                        help="heads keys boxes stages programs warps, flat")
    parser.add_argument("--flush", default="dirty", choices=["dirty", "clean"])
    parser.add_argument("--layout", nargs="+", default=["key"], choices=["key", "head"],
                        help="the floors' cache: key-major (flash-attn's) or head-major (the bench's)")
    args = parser.parse_args()
    from flashtile import set_value_checks
    from flashtile.bench.__main__ import best_of_turns
    from flashtile.bench.decode import peers
    from scripts.decode_l2_probe import flushes, median_us
    set_value_checks(False)
    flush = flushes()[args.flush]
    patterns = list(zip(*[iter(args.patterns)] * 6))
    name = "floor {}h×{}k/{}box s{} p{} w{}".format
    names = ["cuDNN", "flashtile"] + [f"{layout} {name(*p)}" for layout in args.layout for p in patterns]
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    print(f"\nKV TB/s (µs), {args.flush} flush (dirty: do_bench's), best of", args.rounds, "turns\n")
    print("| B | L | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 2) + "|")
    for batch in args.batches:
        for seqlen in args.seqlens:
            fns = peers(batch, seqlen)
            timers = {"cuDNN": fns["cuDNN"], "flashtile": fns["flashtile"]}
            for layout in args.layout:
                kc, vc = (cache(batch, seqlen, layout) for _ in range(2))
                for h, bn, boxes, stages, programs, warps in patterns:
                    timers[f"{layout} {name(h, bn, boxes, stages, programs, warps)}"] = floor_fn(
                        kc, vc, h, bn, stages, warps, boxes, programs)[0]
            best = best_of_turns({n: (lambda f=f: (median_us(f, flush), None)) for n, f in timers.items()},
                                 args.rounds)
            kv = 2 * batch * seqlen * 8 * 128 * 2
            print(f"| {batch} | {seqlen} | " + " | ".join(f"{kv / best[n][0] / 1e6:.3f} ({best[n][0]:.1f})"
                                                         for n in names) + " |", flush=True)
            del fns, kc, vc, timers
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
