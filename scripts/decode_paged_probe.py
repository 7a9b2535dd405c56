"""The paged cache against the contiguous one: the same keys, values and query, read by flashtile through a
shuffled block table (page sizes --pages), by flashtile from a contiguous key-major cache, by cuDNN from its own
head-major copy, and by "gather + cuDNN" (what SDPA users do with a paged cache: gather the pages into a contiguous
cache each step, then attend). Extra flashtile configs on the paged cache with --configs (page_size block_n warps
stages key_groups splits heads, flat: each for its page size; splits 0: automatic). With --leftpad N each page size also
runs with cache_leftpad N for every sequence (the keys before it padding). KV TB/s (µs) counts the whole cache's bytes
once; peers take turns, each keeps its best median.

    PYTHONPATH=. python scripts/decode_paged_probe.py [--batches 1 8 32] [--seqlens 4096 32768] [--pages 16 64 256]
"""
import argparse
import functools

import torch
import torch.nn.functional as F

from flashtile import flash_attn_with_kvcache, ops, set_value_checks
from flashtile.bench.__main__ import best_of_turns
from flashtile.bench.decode import _eager_us, paged_cache
from flashtile.configs import DecodeConfig, from_fields

NHEADS, NHEADS_K, HEAD_DIM = 32, 8, 128


def timers(batch, seqlen, page_sizes, configs, leftpad=0):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(batch, 1, NHEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(batch, seqlen, NHEADS_K, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
    qt = q.transpose(1, 2).contiguous()
    kt, vt = (t.transpose(1, 2).contiguous() for t in (kc, vc))

    def cudnn(k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, k, v, enable_gqa=True).transpose(1, 2)

    def ours(k, v, **kw):
        return flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, **kw)

    fns = {"cuDNN": functools.partial(cudnn, kt, vt), "flashtile, contiguous": functools.partial(ours, kc, vc)}
    for page_size in page_sizes:
        kp, table = paged_cache(kc, page_size)
        vp, _ = paged_cache(vc, page_size, table=table)
        fns[f"flashtile, pages of {page_size}"] = functools.partial(ours, kp, vp, block_table=table)
        if leftpad:
            pads = torch.full((batch,), leftpad, dtype=torch.int32, device="cuda")
            fns[f"pages of {page_size}, leftpad {leftpad}"] = functools.partial(ours, kp, vp, block_table=table,
                                                                               cache_leftpad=pads)
        fns[f"gather + cuDNN, {page_size}"] = lambda kp=kp, vp=vp, table=table: cudnn(
            kp[table].flatten(1, 2).transpose(1, 2), vp[table].flatten(1, 2).transpose(1, 2))
        for c in (c[1:] for c in configs if c[0] == page_size):
            cfg, splits = from_fields(DecodeConfig, (*c[:4], c[5])), c[4]
            fns[f"{page_size}: " + "/".join(map(str,
                                                c))] = lambda kp=kp, vp=vp, table=table, cfg=cfg, splits=splits: ops.kvcache_forward(  # noqa: E501
                q, kp, vp, seqlens, None, table, seqlen, HEAD_DIM ** -0.5, (-1,
                                                                            -1), splits, config=cfg, want_lse=False)[0]
    return fns


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--pages", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--configs", type=int, nargs="*", default=[])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--leftpad", type=int, default=0)
    args = parser.parse_args()
    configs = list(zip(*[iter(args.configs)] * 7))
    set_value_checks(False)
    header = None
    for batch in args.batches:
        for seqlen in args.seqlens:
            fns = timers(batch, seqlen, args.pages, configs, args.leftpad)
            outs = {name: fn().float() for name, fn in fns.items()}
            worst = max((outs[n] - outs["cuDNN"]).abs().max().item() for n in outs if "leftpad" not in n)
            best = best_of_turns({n: functools.partial(_eager_us, fn) for n, fn in fns.items()}, args.rounds)
            if header is None:
                header = list(fns)
                print(f"{torch.cuda.get_device_name()} torch {torch.__version__}: KV TB/s (µs), best of "
                      f"{args.rounds} turns\n\n| B | L | " + " | ".join(header) + " |\n" + "|---" * (2 + len(header))
                      + "|")
            kv_bytes = 2 * batch * seqlen * NHEADS_K * HEAD_DIM * 2
            cells = [f"{kv_bytes / best[n][0] / 1e6:.2f} ({best[n][0]:.1f})" if best[n][0] else best[n][1][:20]
                     for n in header]
            print(f"| {batch} | {seqlen} | " + " | ".join(cells) + f" |  max |Δ| to cuDNN {worst:.1e}", flush=True)
            del fns, outs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
