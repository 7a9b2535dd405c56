"""Quick look at the warp-specialized sm90 forward before the full GPU suite: each shape once, its error
against float64 beside the error of PyTorch's own attention in the same precision, and its speed beside
cuDNN's. Run on the GPU: ``PYTHONPATH=. python scripts/check_hopper.py``."""
import torch
import torch.nn.functional as F
import triton

from flashtile import configs, dispatch, flash_attn_func


def sdpa(q, k, v, causal, backend=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if backend is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    else:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2)


def main():
    print("| D | causal | B,Nq,Nk,H,Hk | hopper kernel | rel err | torch rel err | TFLOP/s | cuDNN TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for d in (64, 128, 256):
        for causal in (False, True):
            for b, nq, nk, h, hk in ((2, 1000, 1000, 4, 4), (1, 777, 777 if causal else 3001, 8, 2),
                                     (4, 4096, 4096, 2048 // d, 2048 // d)):
                q = torch.randn(b, nq, h, d, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(b, nk, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                used = dispatch.hopper_forward_config(q, k, v, (-1, 0) if causal else (-1, -1)) is not None
                out = flash_attn_func(q, k, v, causal=causal)
                torch.cuda.synchronize()
                ref = sdpa(q.double(), k.double(), v.double(), causal, "MATH")
                base = sdpa(q, k, v, causal)
                err = ((out.double() - ref).norm() / ref.norm()).item()
                base_err = ((base.double() - ref).norm() / ref.norm()).item()
                flops = 4 * b * h * nq * nk * d / (2 if causal else 1)
                ms = triton.testing.do_bench(lambda: flash_attn_func(q, k, v, causal=causal), return_mode="median")
                ms_cudnn = triton.testing.do_bench(lambda: sdpa(q, k, v, causal, "CUDNN_ATTENTION"),
                                                   return_mode="median")
                print(f"| {d} | {causal} | {b},{nq},{nk},{h},{hk} | {used} | {err:.2e} | {base_err:.2e} | "
                      f"{flops / ms / 1e9:.0f} | {flops / ms_cudnn / 1e9:.0f} |", flush=True)
    print("backend:", configs.FWD_BACKEND)


if __name__ == "__main__":
    main()
