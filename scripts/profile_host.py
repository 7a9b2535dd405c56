"""Host time of one eager call, piece by piece (mean over many calls, no synchronization; every GPU kernel
here is shorter than the host path, so the host sets the pace). Decode: B=1, L=4k, 32/8 heads, D=128;
forward: B=1, N=128, 16 heads, D=128; forward + backward through autograd the same, causal. ``--cprofile`` also prints
the Python functions that take the host time of that training step. Run on the GPU:
``PYTHONPATH=. python scripts/profile_host.py [--cprofile]``."""
import cProfile
import pstats
import sys

import torch
import triton

import flashtile
from flashtile import checks, dispatch, ops
from flashtile.bench.__main__ import host_ms
from flashtile.kernels.portable.decode import launch_decode, partial_elements


@triton.jit
def _empty_kernel(X):
    pass


def per_call_us(fn, calls=2000):
    """Mean host µs of ``fn`` over ``calls`` calls after 50 unmeasured ones, no synchronization in between (the
    bench's host_ms; on a machine without a GPU, the Python alone)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    return host_ms(fn, sync, calls, warmup=50) * 1e3


def main():
    flashtile.set_value_checks(False)
    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache = (torch.randn(1, 4096, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((1,), 4096, dtype=torch.int32, device="cuda")
    out, lse = torch.empty_like(q), torch.empty(1, 32, 1, device="cuda")
    cfg = dispatch.decode_config(128, False)
    scratch = ops._scratch(q.device, 8, partial_elements(16, 1, 1, 32, 128))
    x = torch.empty(1, device="cuda")
    qf, kf, vf = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k1, v1 = (torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    rows = {
        "decode: flash_attn_with_kvcache": lambda: flashtile.flash_attn_with_kvcache(q, k_cache, v_cache,
                                                                                     cache_seqlens=seqlens),
        "decode step, 1 new token appended": lambda: flashtile.flash_attn_with_kvcache(
            q, k_cache, v_cache, k1, v1, cache_seqlens=seqlens - 1),
        "append: ops.append_to_cache (one launch)": lambda: ops.append_to_cache(k_cache, v_cache, k1, v1, seqlens - 1,
                                                                             None, None),
        "append: torch indexing (before decode v7)": lambda: _append_by_indexing(k_cache, v_cache, k1, v1,
                                                                               seqlens - 1),
        "decode: checks.kvcache": lambda: checks.kvcache(q, k_cache, v_cache, None, None, seqlens, None, None),
        "decode: ops.kvcache_forward": lambda: ops.kvcache_forward(q, k_cache, v_cache, seqlens, None, None, 4096,
                                                                   0.088, (-1, -1), 0),
        "decode: launch_decode (16 splits)": lambda: launch_decode(q, k_cache, v_cache, seqlens, None, None, out, lse,
                                                                   16, 256, 0.088, (-1, -1), cfg, scratch),
        "decode: launch_decode (1 split)": lambda: launch_decode(q, k_cache, v_cache, seqlens, None, None, out, lse,
                                                                 1, 4096, 0.088, (-1, -1), cfg),
        "torch.empty x2": lambda: (torch.empty(16, 1, 1, 32, 128, device="cuda"), torch.empty(1, 32, 1, device="cuda")),
        "triton: empty kernel, 1 arg": lambda: _empty_kernel[(1,)](x),
        "forward: flash_attn_func": lambda: flashtile.flash_attn_func(qf, kf, vf),
        "forward: ops.attention_forward": lambda: ops.attention_forward(qf, kf, vf, 0.088, (-1, -1), True),
        "SDPA cuDNN (reference point)": lambda: sdpa_cudnn(qf, kf, vf),
    }
    qg, kg, vg = (t.detach().requires_grad_() for t in (qf, kf, vf))
    dout = torch.randn_like(qf)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (qf, kf, vf))

    def step():
        torch.autograd.grad(flashtile.flash_attn_func(qg, kg, vg, causal=True), (qg, kg, vg), dout)

    def step_fa2():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        torch.autograd.grad(out, (qt, kt, vt), dout.transpose(1, 2))
    out, lse = flashtile.flash_attn_func(qg, kg, vg, causal=True, return_attn_probs=True)[:2]

    def single_thread(fn):
        def run():
            with torch.autograd.set_multithreading_enabled(False):
                fn()
        return run
    rows["fwd+bwd: flash_attn_func, autograd.grad"] = step
    rows["fwd+bwd: the same, autograd on the calling thread"] = single_thread(step)
    rows["fwd+bwd: SDPA FA2 (reference point)"] = step_fa2
    rows["fwd+bwd: SDPA FA2, autograd on the calling thread"] = single_thread(step_fa2)
    rows["bwd: ops.attention_backward (main thread)"] = lambda: ops.attention_backward(
        dout, qf, kf, vf, out.detach(), lse, 0.088, (-1, 0), True, False)
    for name, fn in rows.items():
        print(f"{name}: {per_call_us(fn):.1f} us", flush=True)
    if "--cprofile" in sys.argv:  # on the calling thread, so that the profile sees the backward's Python too
        profile = cProfile.Profile()
        profile.runcall(lambda: [single_thread(step)() for _ in range(500)])
        pstats.Stats(profile).sort_stats("tottime").print_stats(45)


def _append_by_indexing(k_cache, v_cache, k, v, cache_seqlens):
    """The append as it was before decode v7 (contiguous cache), kept here to time against."""
    positions = cache_seqlens[:, None].long() + torch.arange(k.shape[1], device=k.device)
    rows = torch.arange(k.shape[0], device=k.device)[:, None].expand_as(positions)
    k_cache[rows, positions] = k
    v_cache[rows, positions] = v


def sdpa_cudnn(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                v.transpose(1, 2))


if __name__ == "__main__":
    main()
