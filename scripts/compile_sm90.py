"""Compile the forward kernel for sm90 on a machine without a GPU (ptxas ships with triton) and
report each tile config's shared memory and instruction mix. Used by tests/test_compile_sm90.py.

    TRITON_INTERPRET=0 python scripts/compile_sm90.py
"""
import json
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from flashtile import configs
from flashtile.kernels.fwd import flash_fwd_kernel

INTS = ["stride_qn", "stride_qh", "stride_kn", "stride_kh", "stride_vn", "stride_vh", "stride_on", "stride_oh",
        "stride_lb", "stride_lh", "seqlen_q", "seqlen_k", "nheads", "group"]


def compile_fwd(head_dim, cfg, varlen, causal, dtype="bf16"):
    pad = max(32, triton.next_power_of_2(head_dim))
    sig = {}
    for name, block in (("Q", cfg.block_m), ("K", cfg.block_n), ("V", cfg.block_n), ("O", cfg.block_m)):
        sig[name] = f"*{dtype}" if varlen else f"tensordesc<{dtype}[1, {block}, 1, {pad}]>"
    sig.update(LSE="*fp32", cu_seqlens_q="*i32", cu_seqlens_k="*i32")
    sig.update({n: "i32" for n in INTS})
    sig.update(qk_scale="fp32", left="i32", right="i32")
    consts = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                  IS_VARLEN=varlen, BOTTOM_RIGHT=True, MASK_LEFT=False, MASK_RIGHT=causal,
                  DOT_PRECISION="ieee" if dtype == "fp32" else "tf32")
    sig.update({k: "constexpr" for k in consts})
    kernel = triton.compile(ASTSource(flash_fwd_kernel, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    ptx = kernel.asm["ptx"]
    return dict(head_dim=head_dim, config=list(cfg.__dict__.values()), varlen=varlen, causal=causal,
                shared=kernel.metadata.shared, wgmma=ptx.count("wgmma.mma_async"),
                tma_loads=ptx.count("cp.async.bulk.tensor"), local=ptx.count("ld.local") + ptx.count("st.local"))


def main():
    rows = []
    for (pad, causal), cfg in configs.FWD_SM90.items():
        for varlen in (False, True):
            rows.append(compile_fwd(pad, cfg, varlen, causal))
    json.dump(rows, sys.stdout, indent=None)


if __name__ == "__main__":
    main()
