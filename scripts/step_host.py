"""Eager training steps at short sequences: forward + backward through autograd, timed with do_bench, by the path
eager calls take (ops._Attention), by the custom op torch.compile traces (ops.fwd) and by the eager path with the
portable backward (configs.BWD_BACKEND = "portable"), in one process; and the host time of one step (no
synchronization). B·N = 16k tokens, H·D = 2048. ``--cprofile`` also prints, per shape, the Python functions that
take the eager step's host time. ``--parts`` instead times the host path piece by piece on a shape whose kernels are
shorter than it (B=1, N=128, H=16, D=128, causal; mean of 2,000 calls, no synchronization), in turns, and then how
much of a step autograd spends in ops._Attention.backward. Run on the GPU:
``PYTHONPATH=. python scripts/step_host.py [--seqlens 512 1024] [--head-dim 128] [--cprofile] [--parts]``."""
import argparse
import cProfile
import gc
import pstats
import time
from unittest import mock

import torch
import triton

import flashtile
from flashtile import configs

PATHS = ("autograd.Function", "custom op", "portable backward")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--parts", action="store_true")
    args = parser.parse_args(argv)
    if args.parts:
        return parts()
    print("| causal | N | B×H | path | step ms (do_bench) | host ms per step |")
    print("|---|---|---|---|---|---|")
    for causal in (False, True):
        for n in args.seqlens:
            b, h, d = max(1, 16384 // n), 2048 // args.head_dim, args.head_dim
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn_like(q)

            def step():
                torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
            for path in PATHS:
                backend = "portable" if path == "portable backward" else configs.BWD_BACKEND
                with mock.patch("torch.compiler.is_compiling", return_value=path == "custom op"), \
                        mock.patch.object(configs, "BWD_BACKEND", backend):
                    step()
                    ms = triton.testing.do_bench(step, warmup=25, rep=100)
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(20):
                        step()
                    host = (time.perf_counter() - start) / 20
                    torch.cuda.synchronize()
                print(f"| {'yes' if causal else 'no'} | {n} | {b}×{h} | {path} | {ms:.3f} | {host * 1e3:.3f} |",
                      flush=True)
            if args.cprofile:
                profile = cProfile.Profile()
                profile.runcall(lambda: [step() for _ in range(200)])
                torch.cuda.synchronize()
                print(f"cProfile, causal={causal}, N={n}, 200 eager steps:")
                pstats.Stats(profile).sort_stats("tottime").print_stats(25)
                pstats.Stats(profile).sort_stats("cumulative").print_stats("flashtile|autograd", 30)


class _Floor(torch.autograd.Function):
    """The least a Python autograd.Function costs: one new tensor each way."""

    @staticmethod
    def forward(ctx, x):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        return torch.empty_like(g)


class _Shaped(torch.autograd.Function):
    """_Floor with ops._Attention's signature: q, k, v, sinks and the rest in a tuple, (out, lse) out, what
    ops._setup_context saves, five gradients back."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, rest):
        from flashtile import ops
        out, lse = torch.empty_like(q), torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
        ops._setup_context(ctx, (q, k, v, *rest, sinks), (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v = ctx.saved_tensors[:3]
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, None


class _ShapedOne(torch.autograd.Function):
    """_Shaped with O its only output (the LSE saved beside it, as where no gradient can reach the LSE)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, rest):
        return _Shaped.forward(ctx, q, k, v, sinks, rest)[0]

    @staticmethod
    def backward(ctx, dout):
        return _Shaped.backward(ctx, dout, None)


class _ShapedForward(_Shaped):
    """_Shaped's empty forward, ops._Attention's backward (its kernels run on the empty O and LSE)."""

    @staticmethod
    def backward(ctx, dout, dlse):
        from flashtile import ops
        return ops._Attention.backward(ctx, dout, dlse)


def parts(calls=2000, turns=3):
    from profile_host import per_call_us

    from flashtile import ops
    from flashtile.kernels.common import replay
    q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    out, lse = ops.fwd(q.detach(), k.detach(), v.detach(), None, None, 128, 128, 0.088, -1, 0, True, False, False)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))

    def step():
        torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)

    def portable_step():
        with mock.patch.object(configs, "BWD_BACKEND", "portable"):
            step()

    def sdpa_step():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        torch.autograd.grad(o, (qt, kt, vt), dout.transpose(1, 2))

    def backward(backend):
        def run():
            with mock.patch.object(configs, "BWD_BACKEND", backend):
                ops.attention_backward(dout, q.detach(), k.detach(), v.detach(), out, lse, 0.088, (-1, 0), True, False)
        return run

    def floor():
        torch.autograd.grad(_Floor.apply(q), q, dout)

    def one_thread_step():
        with torch.autograd.set_multithreading_enabled(False):
            step()

    def no_gc_step():
        gc.disable()
        try:
            step()
        finally:
            gc.enable()

    def shaped(function=_Shaped):
        def run():
            rest = (None, None, 128, 128, 0.088, -1, 0, True, False, False, 0.0, None)
            out = function.apply(q, k, v, None, rest)
            torch.autograd.grad(out if function is _ShapedOne else out[0], (q, k, v), dout)
        return run

    def no_launch_step():
        with mock.patch.object(replay.Replay, "run", lambda self, device, *tensors: None):
            step()

    def empty_backward_step():
        with mock.patch.object(ops._Attention, "backward", _Shaped.backward):
            step()
    rows = {
        "forward, no grad": lambda: flashtile.flash_attn_func(q.detach(), k.detach(), v.detach(), causal=True),
        "forward, inputs require grad": lambda: flashtile.flash_attn_func(q, k, v, causal=True),
        "forward + backward (sm90 backward)": step,
        "forward + backward (portable backward)": portable_step,
        "forward + backward, autograd on the calling thread": one_thread_step,
        "forward + backward, garbage collector off": no_gc_step,
        "ops.attention_backward (sm90)": backward(configs.BWD_BACKEND),
        "ops.attention_backward (portable)": backward("portable"),
        "autograd.Function floor (empty_like each way)": floor,
        "autograd.Function floor, ops._Attention's signature": shaped(),
        "autograd.Function floor, that signature with O the only output": shaped(_ShapedOne),
        "forward + backward, no kernel launched (replays stubbed)": no_launch_step,
        "our forward, an empty backward": empty_backward_step,
        "an empty forward, our backward": shaped(_ShapedForward),
        "torch.empty x3": lambda: [torch.empty(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3)],
        "SDPA FA2 forward + backward (reference point)": sdpa_step,
    }
    times = {name: [] for name in rows}
    for _ in range(turns):
        for name, fn in rows.items():
            times[name].append(per_call_us(fn, calls))
    print("| host path (B=1, N=128, H=16, D=128, causal) | µs per call, min of turns | turns |")
    print("|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {min(ts):.1f} | {' / '.join(f'{t:.1f}' for t in ts)} |")
    inside(step, calls)


def inside(step, calls):
    """Of an eager step's host time: how much autograd spends in ops._Attention.backward, on which thread, and how
    many launches went through Triton (replay misses) and descriptors were encoded meanwhile."""
    import threading

    from flashtile import ops
    from flashtile.kernels.common import replay
    spent, threads, counts = [0.0, 0.0], set(), {"replay misses": 0, "descriptor encodings": 0}
    backward, init, encode = ops._Attention.backward, replay.Replay.__init__, replay._RawLaunch.encode
    attention_backward = ops.attention_backward

    def timed_attention_backward(*args, **kwargs):
        start = time.perf_counter()
        result = attention_backward(*args, **kwargs)
        spent[1] += time.perf_counter() - start
        return result

    def timed_backward(ctx, *grads):
        start = time.perf_counter()
        threads.add(threading.get_ident())
        result = backward(ctx, *grads)
        spent[0] += time.perf_counter() - start
        return result

    def counted_init(self, *args, **kwargs):
        counts["replay misses"] += 1
        init(self, *args, **kwargs)

    def counted_encode(self, slot, tensor, meta):
        counts["descriptor encodings"] += (slot, tensor.data_ptr()) not in self.encoded
        return encode(self, slot, tensor, meta)
    with mock.patch.object(ops._Attention, "backward", staticmethod(timed_backward)), \
            mock.patch.object(replay.Replay, "__init__", counted_init), \
            mock.patch.object(replay._RawLaunch, "encode", counted_encode), \
            mock.patch.object(ops, "attention_backward", timed_attention_backward):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            step()
        total = (time.perf_counter() - start) / calls * 1e6
        torch.cuda.synchronize()
    where = "main" if threads == {threading.get_ident()} else "autograd engine"
    print(f"\nforward + backward: {total:.1f} µs a step, {spent[0] / calls * 1e6:.1f} of them in "
          f"ops._Attention.backward (on the {where}'s thread), {spent[1] / calls * 1e6:.1f} in its "
          f"ops.attention_backward; over {calls} steps "
          + ", ".join(f"{n} {c}" for n, c in counts.items()))


if __name__ == "__main__":
    main()
