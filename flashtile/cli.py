"""``flashtile demo | bench | tune | viz | info``."""
import argparse
import os
import sys
import time

import torch


def _use_interpreter_without_gpu():
    """The kernels run on the CPU only under the Triton interpreter, which must be chosen before triton loads."""
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
        return True
    return os.environ.get("TRITON_INTERPRET") == "1"


def _positive_int(text):
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _median_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def demo(args):
    interpreter = _use_interpreter_without_gpu()
    import torch.nn.functional as F

    from . import flash_attn_func, reference
    from .bench.__main__ import fwd_flops

    if interpreter:
        device, dtype = "cpu", torch.float16
        batch, seqlen, nheads, head_dim = 1, args.seqlen or 256, 2, 64
        print("No CUDA GPU: running the same Triton kernels under the Triton interpreter (TRITON_INTERPRET=1) "
              "on a small problem. Times below are the interpreter's, not a GPU's.")
    else:
        device, dtype = "cuda", torch.bfloat16
        batch, seqlen, nheads, head_dim = 4, args.seqlen or 4096, 16, 128
        print(f"GPU: {torch.cuda.get_device_name()}")
    causal = not args.no_causal
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, nheads, head_dim, device=device, dtype=dtype) for _ in range(3))
    print(f"shape: batch {batch}, seqlen {seqlen}, heads {nheads}, head dim {head_dim}, {dtype}, "
          f"{'causal' if causal else 'non-causal'}")
    from . import dispatch
    print(f"forward: {dispatch.forward(q, k, v, (-1, 0) if causal else (-1, -1))}")

    out = flash_attn_func(q, k, v, causal=causal)
    ref, _ = reference.attention(q[:1], k[:1], v[:1], causal=causal)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    sdpa = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
    ours_err = (out[:1].double() - ref).abs().max().item()
    sdpa_err = (sdpa[:1].double() - ref).abs().max().item()
    print(f"max |error| vs float64 reference: flashtile {ours_err:.2e}, PyTorch SDPA {sdpa_err:.2e}")

    flops = fwd_flops(batch, nheads, seqlen, seqlen, head_dim, causal)
    if interpreter:
        ours_ms = _median_ms(lambda: flash_attn_func(q, k, v, causal=causal), 3)
        sdpa_ms = _median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), 3)
    else:
        from .bench.__main__ import bench_ms
        ours_ms = bench_ms(lambda: flash_attn_func(q, k, v, causal=causal))
        sdpa_ms = bench_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
    for name, ms in (("flashtile", ours_ms), ("PyTorch SDPA", sdpa_ms)):
        print(f"{name:>13}: {ms:9.3f} ms  {flops / ms / 1e9:8.2f} TFLOP/s")
    ok = ours_err <= 2 * sdpa_err + 1e-3
    print("check: PASS" if ok else "check: FAIL")
    return 0 if ok else 1


PAGE_LIMIT_MB = 5  # a step-through page past this is slow to open; viz asks for --force


def viz(args):
    from .trace import trace
    from .viz import playground, render
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        args.parser.error(f"-o {args.output}: the folder {folder} does not exist")
    if args.record and not args.pipeline:
        args.parser.error("--record goes with --pipeline")
    if args.pipeline:
        from .viz import pipeline
        try:
            recorded = pipeline.record(pipeline.SHIPPED) if args.record else pipeline.load()
        except (FileNotFoundError, RuntimeError) as error:
            args.parser.error(str(error))
        html = pipeline.render(recorded)
    elif args.playground:
        html = playground()
    else:
        html = render(trace(args.algo, args.seqlen, args.head_dim, args.block_m, args.block_n, args.causal))
    size_mb = len(html.encode()) / 1e6
    if size_mb > PAGE_LIMIT_MB and not args.force:
        args.parser.error(f"the page would be {size_mb:.1f} MB (every step of every tile is in it); use a smaller "
                          f"--seqlen or larger tiles, or --force to write it anyway")
    with open(args.output, "w") as f:
        f.write(html)
    detail = f" ({args.algo}, N={args.seqlen}, D={args.head_dim}, tiles {args.block_m}x{args.block_n})"
    print(f"wrote {args.output}" + ("" if args.playground or args.pipeline else detail))
    return 0


# The kernel files of each sm90 backward design (configs.HopperBwdConfig.design), in launch order.
BACKWARD_FILES = {"one pass": "portable/bwd.py (delta, zeroed dQ) -> hopper/bwd.py (dK, dV; dQ by the copy engine's"
                              " reduce-add) -> portable/bwd.py (dQ cast)",
                  "two kernels": "hopper/bwd_dq.py (dQ, delta) -> hopper/bwd.py (dK, dV)",
                  "split gradients": "hopper/bwd_dq.py (dQ, delta) -> hopper/bwd_split.py (dV, dK: a warpgroup each)"}


def backward_plans():
    """One line per configs.BWD_HOPPER entry: the head dim, the mask and which kernel files run it, by default and
    with deterministic=True."""
    from . import configs
    lines = []
    for (head_dim, causal), config in sorted(configs.BWD_HOPPER.items()):
        plan, exact = (BACKWARD_FILES[config.design(d)] for d in (False, True))
        lines.append(f"D={head_dim} {'causal' if causal else 'full'}: {plan}"
                     + ("" if exact == plan else f"; deterministic=True: {exact}"))
    return lines


def _call(batch, seqlen, nheads, nheads_k, head_dim, causal, device="cpu", dtype=torch.bfloat16):
    """(q, k, window) of a flash_attn_func call of that shape as the kernels see it (the head dim ops.pad_head_dim pads
    to a multiple of 8, the window checks.window makes), new tensors (k stands for v and q for dO too); ``causal``
    True, False or a sliding window (left, right)."""
    from .checks import window
    from .ops import pad_head_dim
    q, k = pad_head_dim(torch.empty(batch, seqlen, nheads, head_dim, device=device, dtype=dtype),
                        torch.empty(batch, seqlen, nheads_k, head_dim, device=device, dtype=dtype))
    return q, k, window(causal if isinstance(causal, tuple) else (-1, -1), causal is True)


def call_plans(batch, seqlen, nheads, nheads_k, head_dim, causal, deterministic=False, softcap=0.0):
    """(forward plan, backward plan) of flash_attn_func on new tensors of that shape on this machine's device (bf16 on
    a GPU; fp16 under the interpreter); ``softcap``: flash-attn's."""
    from . import dispatch
    device, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float16)
    q, k, window = _call(batch, seqlen, nheads, nheads_k, head_dim, causal, device, dtype)
    return (dispatch.forward(q, k, k, window, softcap=softcap),
            dispatch.backward(q, k, k, q, window, deterministic=deterministic, softcap=softcap))


def sm90_forward(batch, seqlen, nheads, nheads_k, head_dim, causal, softcap=0.0):
    """What an sm90 GPU runs for flash_attn_func's forward on bf16 tensors of that shape, on any machine: (config,
    compile-time switches) of kernels/hopper/fwd.py, or None where it runs the portable kernel."""
    from . import dispatch
    q, k, window = _call(batch, seqlen, nheads, nheads_k, head_dim, causal)
    config = dispatch.hopper_forward_pick(q, k, k, window, softcap=softcap)
    if config is None:
        return None
    return config, dispatch.hopper("fwd_launch").switches(q, k, k, window, config, softcap)


def sm90_backward(batch, seqlen, nheads, nheads_k, head_dim, causal, deterministic=False, softcap=0.0):
    """What an sm90 GPU runs for flash_attn_func's backward on bf16 tensors of that shape, on any machine: (config,
    design: the launches in order) of kernels/hopper/bwd.py, or None where it runs the portable kernel."""
    from . import dispatch
    q, k, window = _call(batch, seqlen, nheads, nheads_k, head_dim, causal)
    config = dispatch.hopper_backward_pick(q, k, k, q, window, softcap=softcap)
    return None if config is None else (config, BACKWARD_FILES[config.design(deterministic)])


def decode_plan(batch, cache_len, nheads, nheads_k, head_dim):
    """flash_attn_with_kvcache's plan for one new token a sequence over a (batch, cache_len, nheads_k, head_dim)
    cache, flash-attn's layout, on this machine's device (as call_plans)."""
    from . import dispatch
    device, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float16)
    q = torch.empty(batch, 1, nheads, head_dim, device=device, dtype=dtype)
    cache = torch.empty(batch, cache_len, nheads_k, head_dim, device=device, dtype=dtype)
    return dispatch.decode(q, cache, cache, cache_len)


def info(args):
    import triton
    print(f"torch {torch.__version__}, triton {triton.__version__}")
    kv_heads = args.kv_heads or args.heads
    if args.heads % kv_heads:
        args.parser.error(f"--heads ({args.heads}) must be a multiple of --kv-heads ({kv_heads})")
    mask = tuple(args.window) if args.window else args.causal  # (the helpers take either)
    forward, backward = call_plans(args.batch, args.seqlen, args.heads, kv_heads, args.head_dim, mask,
                                   args.deterministic, args.softcap)
    print(f"flash_attn_func on (batch {args.batch}, seqlen {args.seqlen}, heads {args.heads}/{kv_heads}, head dim "
          f"{args.head_dim}{f', window {mask}' if args.window else ', causal' if args.causal else ''}"
          f"{f', softcap {args.softcap:g}' if args.softcap else ''}) here runs, in "
          "flashtile/:")
    print(f"  forward: {forward}")
    print(f"  backward: {backward}")
    print(f"  decode, one new token over {args.cache_len} cached keys (flash_attn_with_kvcache): "
          f"{decode_plan(args.batch, args.cache_len, args.heads, kv_heads, args.head_dim)}")
    hopper_fwd = sm90_forward(args.batch, args.seqlen, args.heads, kv_heads, args.head_dim, mask, args.softcap)
    if hopper_fwd is None:
        print("on an sm90 GPU (H100, H200) in bf16 the forward runs kernels/portable/fwd.py")
    else:
        config = ", ".join(f"{name}={value!r}" for name, value in vars(hopper_fwd[0]).items() if name != "below")
        print(f"on an sm90 GPU (H100, H200) in bf16 the forward runs kernels/hopper/fwd.py with "
              f"{type(hopper_fwd[0]).__name__}({config}), compiled with {hopper_fwd[1]}")
    hopper_bwd = sm90_backward(args.batch, args.seqlen, args.heads, kv_heads, args.head_dim, mask,
                               args.deterministic, args.softcap)
    if hopper_bwd is None:
        print("on an sm90 GPU (H100, H200) in bf16 the backward runs kernels/portable/bwd.py")
    else:
        print(f"on an sm90 GPU (H100, H200) in bf16 the backward runs, in kernels/, {hopper_bwd[1]} with "
              f"{hopper_bwd[0]}")
    from .kernels.common.tiles import head_dim_pad
    tile = head_dim_pad(args.head_dim)
    if tile != args.head_dim and (hopper_fwd is not None or hopper_bwd is not None):
        print(f"  (the sm90 kernels take head dim {args.head_dim} in tiles of {tile} columns, those of head dim "
              f"{tile}: the columns past {args.head_dim} are read as zeros)")
    if torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()} (sm{''.join(map(str, torch.cuda.get_device_capability()))})")
        from . import configs
        print(f"forward backend: {configs.FWD_BACKEND} (FLASHTILE_FWD_BACKEND); the Hopper kernel covers head dims "
              f"in tiles of {sorted({d for d, _ in configs.FWD_HOPPER})} on sm90")
        print(f"backward backend: {configs.BWD_BACKEND} (FLASHTILE_BWD_BACKEND); on sm90, batch mode, in "
              f"flashtile/kernels/:")
        for line in backward_plans():
            print(f"  {line}")
    else:
        print("no CUDA GPU: kernels run under the Triton interpreter (TRITON_INTERPRET=1)")
    return 0


def main(argv=None):
    from . import __version__
    parser = argparse.ArgumentParser(prog="flashtile", description="exact attention in Triton")
    parser.add_argument("--version", action="version", version=f"flashtile {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="run attention on one shape, check it, time it beside PyTorch SDPA")
    p_demo.add_argument("--seqlen", type=_positive_int, default=None,
                        help="tokens per sequence (default 4096 on a GPU, 256 under the interpreter)")
    p_demo.add_argument("--no-causal", action="store_true")
    sub.add_parser("bench", help="the full benchmark (GPU); same as python -m flashtile.bench")
    sub.add_parser("tune", help="the tile-config sweep (GPU); same as python -m flashtile.bench.tune")
    p_info = sub.add_parser("info", help="versions, device, and which kernel and config serve a call")
    p_info.add_argument("--batch", type=_positive_int, default=1)
    p_info.add_argument("--seqlen", type=_positive_int, default=4096)
    p_info.add_argument("--heads", type=_positive_int, default=16)
    p_info.add_argument("--kv-heads", type=_positive_int, default=None, help="GQA/MQA (default: --heads)")
    p_info.add_argument("--head-dim", type=_positive_int, default=128)
    p_info.add_argument("--causal", action="store_true")
    p_info.add_argument("--window", type=int, nargs=2, metavar=("LEFT", "RIGHT"),
                        help="a sliding window (flash-attn's window_size, -1 unbounded) instead of --causal")
    p_info.add_argument("--deterministic", action="store_true")
    p_info.add_argument("--softcap", type=float, default=0.0, help="flash-attn's softcap (scores capped by tanh)")
    p_info.add_argument("--cache-len", type=_positive_int, default=4096, help="keys in the cache, for the decode plan")
    p_viz = sub.add_parser("viz", help="a self-contained HTML step-through of a tiled algorithm, or the playground")
    p_viz.add_argument("--algo", choices=["naive", "softmax", "fa1", "fa2", "fa2_bwd", "decode"], default="fa2")
    p_viz.add_argument("--seqlen", type=_positive_int, default=8)
    p_viz.add_argument("--head-dim", type=_positive_int, default=4)
    p_viz.add_argument("--block-m", type=_positive_int, default=2)
    p_viz.add_argument("--block-n", type=_positive_int, default=2)
    p_viz.add_argument("--causal", action="store_true")
    p_viz.add_argument("--playground", action="store_true", help="the interactive attention playground instead")
    p_viz.add_argument("--pipeline", action="store_true",
                       help="the sm90 forward's pipeline as recorded inside the kernel (the trace flashtile ships)")
    p_viz.add_argument("--record", action="store_true",
                       help="with --pipeline: record the trace anew first (an sm90 GPU), into the package")
    p_viz.add_argument("--force", action="store_true", help=f"write a page over {PAGE_LIMIT_MB} MB too")
    p_viz.add_argument("-o", "--output", default="page.html")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # their own parsers take the rest
        from .bench.__main__ import main as bench_main
        return bench_main(argv[1:])
    if argv[:1] == ["tune"]:
        from .bench.tune import main as tune_main
        return tune_main(argv[1:])
    args = parser.parse_args(argv)
    args.parser = {"viz": p_viz, "info": p_info}.get(args.command, parser)
    return {"demo": demo, "info": info, "viz": viz}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
