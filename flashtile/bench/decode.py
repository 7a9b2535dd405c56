"""``python -m flashtile.bench.decode``: flash decoding against SDPA's cuDNN and flash backends.

One new query token per sequence, 32 query heads over 8 KV heads, head dim 128, bf16; the figure of
merit is KV-cache bytes read per second (2·B·L·H_kv·D·2 bytes over the time). Also the whole decode
step replayed as a CUDA graph, where launch overhead no longer counts. Every peer reads the same cache tensors, in
one of two layouts (--layouts): "head", SDPA's (batch, H_kv, L, D) contiguous (flashtile takes its
(batch, L, H_kv, D) transpose), or "key", flash-attn's (batch, L, H_kv, D) contiguous (SDPA takes the transpose).
Writes decode.md, decode.json and decode.png (KV TB/s by cache length) to --out; ``--replot decode.json`` draws the
plot again without a GPU.
"""
import argparse
import functools
import json
import os

import torch
import torch.nn.functional as F

from . import require_gpu
from .__main__ import bench_ms, best_of_turns, error_text, is_oom, progress


def peers(batch, seqlen, nheads=32, nheads_k=8, head_dim=128, layout="head"):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .. import flash_attn_with_kvcache, set_value_checks
    q = torch.randn(batch, 1, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache = (torch.randn(batch, seqlen, nheads_k, head_dim, device="cuda", dtype=torch.bfloat16)
                        for _ in range(2))
    seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
    qt = q.transpose(1, 2).contiguous()
    if layout == "head":
        kt, vt = (t.transpose(1, 2).contiguous() for t in (k_cache, v_cache))
        del k_cache, v_cache
    else:
        kt, vt = (t.transpose(1, 2) for t in (k_cache, v_cache))

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        return run
    # flashtile reads the same tensors as flash-attn's (batch, seqlen, nheads_k, headdim)
    k_view, v_view = kt.transpose(1, 2), vt.transpose(1, 2)
    def ours(value_checks):
        def run():
            set_value_checks(value_checks)
            try:
                return flash_attn_with_kvcache(q, k_view, v_view, cache_seqlens=seqlens)
            finally:
                set_value_checks(None)
        return run
    return {
        "flashtile": ours(None),
        "flashtile, value checks on": ours(True),
        "cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION),
        "FA2 (SDPA flash)": sdpa(SDPBackend.FLASH_ATTENTION),
    }


def paged_cache(cache, page_size, spare_pages=0, table=None, fill=None):
    """cache (batch, L, H_kv, D) as a pool of shuffled pages, (batch·L / page_size + spare_pages, page_size, H_kv, D),
    and the int32 block table (batch, L / page_size) that reads it back. ``table``: reuse an earlier call's (V beside
    K). The spare pages hold random values, or ``fill``."""
    batch, seqlen = cache.shape[:2]
    per_seq = seqlen // page_size
    shape = (batch * per_seq + spare_pages, page_size, *cache.shape[2:])
    if table is None:
        table = torch.randperm(shape[0], device=cache.device)[:batch * per_seq].view(batch, per_seq).to(torch.int32)
    pool = (torch.randn(shape, device=cache.device, dtype=torch.float32).to(cache.dtype) if fill is None
            else torch.full(shape, fill, device=cache.device, dtype=cache.dtype))
    pool[table.flatten().long()] = cache.reshape(-1, *shape[1:])
    return pool, table


SWEEP_SHAPES = ((1, 4096), (1, 32768), (8, 4096), (8, 32768), (8, 131072), (32, 4096), (32, 32768))
SWEEP_CONFIGS = ((128, 4, 3, 4), (128, 4, 2, 4), (128, 4, 3, 1), (128, 4, 2, 1), (64, 4, 4, 4), (64, 4, 3, 1))


def sweep(shapes=SWEEP_SHAPES, configs=SWEEP_CONFIGS, splits=(0, 1, 2, 4, 8, 16), rounds=2):
    """Decode tile configs (block_n, warps, stages, key_groups) and split counts (0: automatic) on a few shapes,
    contiguous cache, timed like the bench (eager do_bench, turns with cuDNN in the same loop): KV TB/s (µs) per
    cell."""
    from .. import ops
    from ..configs import DecodeConfig, from_fields
    candidates = [(from_fields(DecodeConfig, c), s) for c in configs for s in splits]
    print("| block_n, warps, stages, key_groups, splits | " + " | ".join(f"B={b} L={n}" for b, n in shapes) + " |")
    print("|---" * (len(shapes) + 1) + "|")
    results = {c: [] for c in [None, *candidates]}
    for batch, seqlen in progress(shapes, "sweep"):
        fns = peers(batch, seqlen)
        q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        kc, vc = (torch.randn(batch, 8, seqlen, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                  for _ in range(2))
        seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
        idx = torch.arange(batch, dtype=torch.int32, device="cuda")
        timers = {None: functools.partial(_eager_us, fns["cuDNN"])}
        for cfg, s in candidates:
            timers[(cfg, s)] = functools.partial(_eager_us, functools.partial(
                ops.kvcache_forward, q, kc, vc, seqlens, idx, None, seqlen, 0.088, (-1, -1), s, config=cfg,
                want_lse=False))
        kv_bytes = 2 * batch * seqlen * 8 * 128 * 2
        for key, (us, error) in best_of_turns(timers, rounds).items():
            results[key].append(f"{kv_bytes / us / 1e6:.2f} ({us:.0f})" if us else error[:20])
        del fns, q, kc, vc
        torch.cuda.empty_cache()
    for key, cells in results.items():
        name = "cuDNN" if key is None else ", ".join(str(int(v)) for v in (*vars(key[0]).values(), key[1]))
        print(f"| {name} | " + " | ".join(cells) + " |")


LAYOUTS = {"head": "The cache as SDPA lays it out, (batch, H_kv, L, D) contiguous (flashtile reads its transpose):",
           "key": "The cache as flash-attn lays it out, (batch, L, H_kv, D) contiguous (SDPA reads its transpose):"}


def table(rows):
    """Markdown: a row per (B, L), each peer's eager KV TB/s (µs), ours / cuDNN, then the CUDA-graph µs."""
    names = list(dict.fromkeys(r["peer"] for r in rows))
    lines = ["| B | L | " + " | ".join(f"{n} TB/s (µs)" for n in names) + " | flashtile / cuDNN | " +
             " | ".join(f"{n} graph µs" for n in names) + " |", "|---" * (3 + 2 * len(names)) + "|"]
    for batch, seqlen in dict.fromkeys((r["batch"], r["seqlen"]) for r in rows):
        cells = {r["peer"]: r for r in rows if (r["batch"], r["seqlen"]) == (batch, seqlen)}
        speed = [f"{c['tbps']:.2f} ({c['us']:.1f})" if "tbps" in c else c.get("error", "–")[:20]
                 for c in (cells.get(n, {}) for n in names)]
        ours, cudnn = cells.get("flashtile", {}), cells.get("cuDNN", {})
        ratio = f"{cudnn['us'] / ours['us']:.3f}" if "us" in ours and "us" in cudnn else "–"
        graph = [f"{cells[n]['graph_us']:.1f}" if "graph_us" in cells.get(n, {}) else "–" for n in names]
        lines.append(f"| {batch} | {seqlen} | " + " | ".join(speed) + f" | {ratio} | " + " | ".join(graph) + " |")
    return "\n".join(lines) + "\n"


PLOT_PEERS = ("flashtile", "cuDNN", "FA2 (SDPA flash)")
PLOT_TITLES = {"head": "SDPA's head-major cache (B, H_kv, L, D)", "key": "flash-attn's key-major cache (B, L, H_kv, D)"}


def plot(rows, path):
    """KV TB/s against the cache length, a panel per layout, a line per (peer, batch): eager times, flashtile bold."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(layouts), figsize=(6 * len(layouts), 4.2), squeeze=False, sharey=True)
    colors = dict(zip(PLOT_PEERS, ("tab:red", "tab:blue", "tab:gray")))
    for ax, layout in zip(axes[0], layouts):
        for peer in PLOT_PEERS:
            for batch, marker in zip(batches, "os^Dv"):
                pts = sorted((r["seqlen"], r["tbps"]) for r in rows
                             if (r["layout"], r["peer"], r["batch"]) == (layout, peer, batch) and "tbps" in r)
                if pts:
                    ax.plot(*zip(*pts), marker=marker, color=colors[peer], label=f"{peer}, B={batch}",
                            linewidth=2.5 if peer == "flashtile" else 1.2, alpha=1.0 if peer == "flashtile" else 0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(PLOT_TITLES[layout])
        ax.set_xlabel("cache length L (keys)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("KV cache read, TB/s (decode, 32/8 heads, D=128, bf16)")
    axes[0][-1].legend(fontsize=7, ncol=len(PLOT_PEERS))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _eager_us(fn):
    """(median µs of fn called eagerly, None), or (None, the reason it could not run)."""
    try:
        fn()
        return bench_ms(fn) * 1e3, None
    except Exception as err:  # a backend that refuses the shape is reported, not fatal
        return None, error_text(err, 80)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashtile.bench.decode", description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 32768, 131072])
    parser.add_argument("--graph-max-batch", type=int, default=8, help="CUDA-graph timing for B up to this")
    parser.add_argument("--rounds", type=int, default=3, help="eager turns each peer takes per shape; best kept")
    parser.add_argument("--layouts", nargs="+", default=["head", "key"], choices=["head", "key"],
                        help="the cache every peer reads: SDPA's head-major, flash-attn's key-major")
    parser.add_argument("--out", default="results")
    parser.add_argument("--replot", metavar="DECODE_JSON", help="only draw decode.png again from a saved decode.json")
    parser.add_argument("--sweep", action="store_true", help="only sweep the decode tile configs")
    parser.add_argument("--sweep-configs", type=int, nargs="+",
                        help="block_n warps stages key_groups, flat (with --sweep)")
    parser.add_argument("--sweep-splits", type=int, nargs="+", default=[0, 1, 2, 4, 8, 16])
    args = parser.parse_args(argv)
    if args.replot:
        with open(args.replot) as f:
            rows = json.load(f)
        os.makedirs(args.out, exist_ok=True)
        return plot(rows, os.path.join(args.out, "decode.png"))
    require_gpu("python -m flashtile.bench.decode")
    if args.sweep:
        cfgs = SWEEP_CONFIGS if not args.sweep_configs else tuple(zip(*[iter(args.sweep_configs)] * 4))
        return sweep(tuple((b, n) for b in args.batches for n in args.seqlens), cfgs, args.sweep_splits, args.rounds)
    import triton
    os.makedirs(args.out, exist_ok=True)
    rows = []
    shapes = [(layout, b, n) for layout in args.layouts for b in args.batches for n in args.seqlens]
    for layout, batch, seqlen in progress(shapes, "decode"):
        kv_bytes = 2 * batch * seqlen * 8 * 128 * 2
        try:
            fns = peers(batch, seqlen, layout=layout)
        except Exception as err:
            if not is_oom(err):
                raise
            continue
        eager = best_of_turns({name: functools.partial(_eager_us, fn) for name, fn in fns.items()}, args.rounds)
        for name, fn in fns.items():
            row = dict(layout=layout, batch=batch, seqlen=seqlen, peer=name)
            us, error = eager[name]
            if error:
                row["error"] = error
            else:
                row.update(us=us, tbps=kv_bytes / us / 1e6)
                try:
                    if batch <= args.graph_max_batch and seqlen <= 32768:
                        row["graph_us"] = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
                except Exception as err:  # a backend that cannot be captured keeps its eager numbers
                    row["graph_error"] = error_text(err, 80)
            rows.append(row)
        del fns
        torch.cuda.empty_cache()
    report = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}: decode, H=32, H_kv=8, D=128, bf16, "
              f"do_bench median, eager: best of {args.rounds} turns\n" + "".join(
                  f"\n{LAYOUTS[layout]}\n\n" + table([r for r in rows if r["layout"] == layout]) + "\n"
                  for layout in args.layouts))
    with open(os.path.join(args.out, "decode.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, "decode.md"), "w") as f:
        f.write(report)
    plot(rows, os.path.join(args.out, "decode.png"))
    print(report)


if __name__ == "__main__":
    main()
