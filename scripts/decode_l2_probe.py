"""What the L2 holds before a decode step, and what that costs: each kernel timed after a flush that leaves L2
full of dirty lines (do_bench's: a 256 MB memset) and after one that leaves it full of clean lines (a 256 MB
read). A kernel that streams the cache with ordinary loads evicts the dirty lines, which are written back while it
reads (docs/perf/decode.md, "Ruled out in run 32", for what evict-first loads did about it).

    PYTHONPATH=. python scripts/decode_l2_probe.py [--stream] [--batches 1 8 32] [--seqlens 4096 32768 131072]

--stream: a plain streaming read (sum of a bf16 buffer) with and without evict-first loads, the two flushes.
Then decode (32/8 heads, D=128, bf16): cuDNN, the shipped config and the configs given by --configs
(block_n warps stages key_groups splits [heads], flat, --fields numbers each; stages 0: the shipped count; splits
0: automatic, -k: k times automatic), and "before" (kernels/decode_v10.py, a copy of an earlier kernel, where one is
there); the peers take turns, each keeps its best median µs. --layout key: our cache key-major (flash-attn's), with
cuDNN and the shipped dispatch also timed on it ("our cache").
"""
import argparse
import functools

import torch
import triton
import triton.language as tl

FLUSH_BYTES = 256 << 20


@triton.jit
def stream_sum_kernel(X, Out, n, BLOCK: tl.constexpr, EVICTION: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < n, other=0.0, eviction_policy=EVICTION).to(tl.float32)
    tl.atomic_add(Out, tl.sum(acc, 0))


def flushes():
    dirty_buf = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    clean_buf = torch.ones(FLUSH_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    return {"dirty": dirty_buf.zero_, "clean": lambda: clean_buf.sum()}


def median_us(fn, flush, rep_ms=100):
    """Median of fn's event-timed calls, each after ``flush`` (outside the timed region)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush()
        fn()
    end.record()
    torch.cuda.synchronize()
    n = max(10, min(2000, int(rep_ms / max(start.elapsed_time(end) / 5, 1e-3))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        flush()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return float(torch.tensor([s.elapsed_time(e) for s, e in zip(starts, ends)]).median()) * 1e3


def stream_probe(fl):
    print("| streaming read | bytes | flush | µs | TB/s |\n|---|---|---|---|---|")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for nbytes in (64 << 20, 512 << 20, 4 << 30):
        x = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
        out = torch.zeros(1, device="cuda")
        for eviction in ("", "evict_first"):
            run = functools.partial(stream_sum_kernel[(sms * 4,)], x, out, x.numel(), BLOCK=8192, EVICTION=eviction,
                                    num_warps=8)
            for name, flush in fl.items():
                us = median_us(run, flush)
                print(f"| {eviction or 'normal'} | {nbytes >> 20} MB | {name} | {us:.1f} | {nbytes / us / 1e6:.2f} |")
        del x


_PROMOTION = {0: 0, 64: 1, 128: 2, 256: 3}  # CUtensorMapL2promotion
_TMAP_OFFSET = 128  # PyCUtensorMapObject: the object header, then the 128-aligned CUtensorMap


def _encoded(meta, address, shape, strides, padding, promotion):
    """128 bytes of CUtensorMap as triton's fill_tma_descriptor encodes it, but with ``promotion``."""
    import ctypes

    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
    encode = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    rank = len(shape)
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    out = (ctypes.c_uint8 * 128)()
    status = encode(out, TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]], rank, ctypes.c_void_p(address),
                    (u64 * rank)(*reversed(shape)),
                    (u64 * rank)(*[meta["elem_size"] * s for s in reversed(strides[:-1])], 0),
                    (u32 * rank)(*reversed(meta["block_size"])), (u32 * rank)(*[1] * rank), 0, meta["swizzle"],
                    _PROMOTION[promotion], 1 if padding == "nan" else 0)
    return bytes(out) if status == 0 else None


def promotion_probe(batches, seqlens, promotions, rounds, flush):
    """The shipped decode with its pinned K/V descriptors re-encoded with other L2 promotions (triton fixes 128 B):
    each candidate on its own copy of the cache, so that each has its own replay and descriptors."""
    import ctypes

    from triton.backends.nvidia import driver

    from flashtile import ops
    from flashtile.bench.__main__ import best_of_turns
    from flashtile.bench.decode import peers
    original = driver.make_tensordesc_arg
    state = {"promotion": 128, "checked": []}

    def make_arg(arg, meta):
        out = original(arg, meta)
        if meta is not None and state["promotion"] != 128:
            at = id(out[0]) + _TMAP_OFFSET
            mine = _encoded(meta, arg.base.data_ptr(), arg.shape, arg.strides, arg.padding, 128)
            ok = mine == ctypes.string_at(at, 128)
            state["checked"].append(ok)
            if ok:
                ctypes.memmove(at, _encoded(meta, arg.base.data_ptr(), arg.shape, arg.strides, arg.padding,
                                            state["promotion"]), 128)
        return out
    driver.make_tensordesc_arg = make_arg
    names = ["cuDNN"] + [f"promotion {p}" for p in promotions]
    print(f"\nL2 promotion of the K/V descriptors — KV TB/s (µs), best of {rounds} turns\n")
    print("| B | L | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 2) + "|")
    for batch in batches:
        for seqlen in seqlens:
            fns = peers(batch, seqlen)
            q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
            lens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
            timers = {"cuDNN": fns["cuDNN"]}
            for name, promotion in zip(names[1:], promotions):
                kc, vc = (torch.randn(batch, 8, seqlen, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                          for _ in range(2))
                timers[name] = functools.partial(ops.kvcache_forward, q, kc, vc, lens, None, None, seqlen,
                                                 128 ** -0.5, (-1, -1), 0, want_lse=False)
                state["promotion"] = promotion
                timers[name]()  # the first call builds the replay, and with it the pinned descriptors
                state["promotion"] = 128
            kv = 2 * batch * seqlen * 8 * 128 * 2
            best = best_of_turns({n: (lambda f=f: (median_us(f, flush), None)) for n, f in timers.items()}, rounds)
            print(f"| {batch} | {seqlen} | " + " | ".join(f"{kv / best[n][0] / 1e6:.2f} ({best[n][0]:.1f})"
                                                         for n in names) + " |")
            del fns, timers
            torch.cuda.empty_cache()
    print(f"re-encodings checked against triton's bytes: {state['checked']}")
    driver.make_tensordesc_arg = original


def decode_probe(batches, seqlens, configs_flat, rounds, fl, layout="head", fields=5):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashtile import ops
    from flashtile.bench.__main__ import best_of_turns
    from flashtile.bench.decode import peers
    from flashtile.configs import DecodeConfig
    from flashtile.dispatch import decode_config, decode_splits, decode_waves
    from flashtile.kernels.portable import decode
    from tools.decode_read_floor import cache
    cands = list(zip(*[iter(configs_flat)] * fields))
    try:  # the previous kernel, if a copy of it sits beside this one (an A/B in one run)
        from flashtile.kernels import decode_v10 as before
    except ImportError:
        before = None
    names = (["cuDNN", "flashtile (shipped)"] + ["before"] * (before is not None)
             + ["cuDNN, our cache", "flashtile, our cache"] * (layout == "key")
             + ["/".join(map(str, c)) for c in cands])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for flush_name in fl:
        print(f"\nflush: {flush_name}, {layout}-major cache (cuDNN and shipped: head-major) — KV TB/s (µs), best of "
              f"{rounds} turns; columns: block_n/warps/stages (0: shipped)/key_groups/splits (0: automatic, -k: k x "
              "automatic)\n")
        print("| B | L | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 2) + "|")
        for batch in batches:
            for seqlen in seqlens:
                fns = peers(batch, seqlen)
                q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
                kc, vc = (cache(batch, seqlen, layout) for _ in range(2))
                lens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
                timers = {"cuDNN": fns["cuDNN"], "flashtile (shipped)": fns["flashtile"]}
                shipped = decode_config(128, False, decode_waves(batch * 8, sms))
                if before is not None:
                    def run_before(args=(q, kc, vc, lens, None, None, seqlen, 128 ** -0.5, (-1, -1), 0)):
                        ops.launch_decode = before.launch_decode
                        try:
                            return ops.kvcache_forward(*args, config=DecodeConfig(block_n=128, num_warps=4,
                                                                                  num_stages=shipped.num_stages),
                                                       want_lse=False)
                        finally:
                            ops.launch_decode = decode.launch_decode
                    timers["before"] = run_before
                if layout == "key":  # SDPA handed the same key-major cache as a (batch, 8, seqlen, 128) view
                    def cudnn_key_major(q=q.transpose(1, 2), k=kc.transpose(1, 2), v=vc.transpose(1, 2)):
                        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    timers["cuDNN, our cache"] = cudnn_key_major
                    timers["flashtile, our cache"] = functools.partial(  # the dispatch's own choice
                        ops.kvcache_forward, q, kc, vc, lens, None, None, seqlen, 128 ** -0.5, (-1, -1), 0,
                        want_lse=False)
                for name, (bn, warps, stages, groups, s, *heads) in zip(names[-len(cands):], cands):
                    cfg = DecodeConfig(block_n=bn, num_warps=warps, num_stages=stages or shipped.num_stages,
                                       key_groups=groups,
                                       heads=heads[0] if heads else 1)
                    if s < 0:
                        s = -s * decode_splits(batch * 8 // cfg.heads, seqlen, sms)
                    timers[name] = functools.partial(ops.kvcache_forward, q, kc, vc, lens, None, None, seqlen,
                                                     128 ** -0.5, (-1, -1), s, config=cfg, want_lse=False)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    ref = F.scaled_dot_product_attention(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2),
                                                         scale=128 ** -0.5, enable_gqa=True).transpose(1, 2).float()
                errs = {n: (timers[n]()[0].float() - ref).abs().max().item() for n in names[2:] if "cuDNN" not in n}
                kv = 2 * batch * seqlen * 8 * 128 * 2
                best = best_of_turns({n: (lambda f=f: (median_us(f, fl[flush_name]), None)) for n, f in timers.items()},
                                     rounds)
                print(f"| {batch} | {seqlen} | " + " | ".join(f"{kv / best[n][0] / 1e6:.2f} ({best[n][0]:.1f})"
                                                             for n in names) + " |")
                if flush_name == list(fl)[0]:
                    print(f"  max |ours - cuDNN| ({ref.abs().max().item():.2e} the largest output): "
                          + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()))
                del fns, q, kc, vc
                torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 32768, 131072])
    parser.add_argument("--configs", type=int, nargs="*",
                        default=[128, 4, 0, 1, 0, 128, 4, 0, 4, 0])
    parser.add_argument("--fields", type=int, default=5, choices=[5, 6], help="numbers per config (6: with heads)")
    parser.add_argument("--flushes", nargs="+", default=["dirty", "clean"])
    parser.add_argument("--layout", default="head", choices=["head", "key"],
                        help="our cache: head-major (the bench's, as cuDNN's) or key-major (flash-attn's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--promotions", type=int, nargs="*", help="time these L2 promotions of the shipped kernel")
    args = parser.parse_args()
    from flashtile import set_value_checks
    set_value_checks(False)
    fl = {k: v for k, v in flushes().items() if k in args.flushes}
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    if args.stream:
        stream_probe(fl)
    if args.promotions:
        return promotion_probe(args.batches, args.seqlens, args.promotions, args.rounds, next(iter(fl.values())))
    if args.configs is not None and args.batches:
        decode_probe(args.batches, args.seqlens, args.configs, args.rounds, fl, args.layout, args.fields)


if __name__ == "__main__":
    main()
