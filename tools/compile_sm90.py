"""Compile the kernels for sm90 on a machine without a GPU (ptxas ships with triton) and report each
tile config's shared memory and instruction mix. Used by tests/tools/test_compile_sm90.py.

    TRITON_INTERPRET=0 python tools/compile_sm90.py [--decode] [--shard K/N] [--proton]
"""
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from flashtile import checks, configs, dispatch
from flashtile.kernels.common.tiles import head_dim_pad
from flashtile.kernels.portable.bwd import flash_bwd_kernel
from flashtile.kernels.portable.decode import flash_decode_split_kernel, merge_rows_per_step
from flashtile.kernels.portable.fwd import flash_fwd_kernel

FLOATS = {"qk_scale", "softmax_scale", "softcap_scale", "alibi_unit"}
I32 = "i32"
BUNDLES = {  # the portable kernels' tuple arguments: their elements' types
    "flash_fwd_kernel": dict(qkvo_strides=(I32, ) * 8),
    "flash_bwd_kernel": dict(qkv_strides=(I32, ) * 8, grad_strides=(I32, ) * 6, lse_strides=(I32, ) * 2,
                             dq_acc_strides=(I32, ) * 3, sizes=(I32, ) * 6, scales=("fp32", ) * 4 + (I32, ),
                             band=(I32, ) * 2),
    "flash_decode_split_kernel": dict(q_strides=(I32, ) * 3, kv_strides=(I32, ) * 6,
                                      part_strides=(I32, ) * 8, out_strides=(I32, ) * 5, sizes=(I32, ) * 5,
                                      paging=(I32, ) * 3, scales=("fp32", ) * 3 + (I32, ), band=(I32, ) * 2),
}
TARGET = GPUTarget("cuda", 90, 32)


def compile_kernel(kernel, tensors, consts, cfg, varlen, dtype="bf16", heads=1):
    """tensors: name -> block rows of its tiles (a descriptor in batch mode, a pointer when varlen); ``heads`` of
    each a tile (decode's boxes over the heads-first view)."""
    pad = consts["HEAD_DIM_PAD"]
    sig = {}
    for name in kernel.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in BUNDLES.get(kernel.__name__, {}):
            sig[name] = BUNDLES[kernel.__name__][name]
        elif name in tensors:
            kind = "fp32" if name == "dQacc" else dtype
            box = f"{heads}, {tensors[name]}" if heads > 1 else f"{tensors[name]}, 1"
            sig[name] = f"*{kind}" if varlen else f"tensordesc<{kind}[1, {box}, {pad}]>"
        elif name in ("LSE", "Delta", "dQacc", "Part", "Alibi", "Sinks"):
            sig[name] = "*fp32"
        elif name in ("Q", "K", "V", "Out"):  # decode's pointers (its K, V descriptors are listed in tensors)
            sig[name] = f"*{dtype}"
        elif name == "__never__":
            sig[name] = "*fp32"
        elif name.startswith("cu_seqlens") or name in ("cache_seqlens", "block_table", "batch_idx", "arrivals",
                                                       "cache_leftpad"):
            sig[name] = "*i32"
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    compiled = triton.compile(ASTSource(kernel, sig, constexprs=consts), target=TARGET,
                              options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    ptx = compiled.asm["ptx"]
    if PTX_SINK is not None:
        PTX_SINK.append((kernel.__name__, ptx))
    return dict(kernel=kernel.__name__, head_dim=consts["HEAD_DIM"], config=list(cfg.__dict__.values()),
                varlen=varlen, causal=consts["MASK_RIGHT"], dq=consts.get("DQ_ATOMIC"),
                shared=compiled.metadata.shared,
                wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"),
                tma_loads=ptx.count("cp.async.bulk.tensor"),
                local=ptx.count("ld.local") + ptx.count("st.local"),
                tma_reduce=ptx.count("cp.reduce.async.bulk.tensor"), clock_reads=ptx.count("%clock"))


def consts_for(head_dim, cfg, varlen, causal, **extra):
    return dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad(head_dim), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                IS_VARLEN=varlen, BOTTOM_RIGHT=True, MASK_LEFT=False, MASK_RIGHT=causal, SOFTCAP=False,
                HAS_ALIBI=False, DOT_PRECISION="tf32", **extra)


def compile_fwd(pad, causal, cfg, varlen):
    """The portable forward with a shipped tile config."""
    tensors = dict(Q=cfg.block_m, K=cfg.block_n, V=cfg.block_n, O=cfg.block_m)
    return compile_kernel(flash_fwd_kernel, tensors, consts_for(pad, cfg, varlen, causal, HAS_SINK=False), cfg,
                          varlen)


def compile_bwd(pad, causal, cfg, varlen, atomic):
    """The portable backward with a shipped tile config and dQ by ``atomic`` ("none": Q-tile programs)."""
    tensors = dict(Q1=cfg.block_m1, dO1=cfg.block_m1, K1=cfg.block_n1, V1=cfg.block_n1, dK=cfg.block_n1,
                   dV=cfg.block_n1, Q2=cfg.block_m2, dO2=cfg.block_m2, K2=cfg.block_n2, V2=cfg.block_n2,
                   dQ=cfg.block_m2)
    if atomic == "tma":
        tensors["dQacc"] = cfg.block_m1
    consts = dict(HEAD_DIM=pad, HEAD_DIM_PAD=pad, BLOCK_M1=cfg.block_m1, BLOCK_N1=cfg.block_n1,
                  BLOCK_M2=cfg.block_m2, BLOCK_N2=cfg.block_n2, IS_VARLEN=varlen, BOTTOM_RIGHT=True,
                  MASK_LEFT=False, MASK_RIGHT=causal, DQ_ATOMIC=atomic, DOT_PRECISION="tf32",
                  SOFTCAP=False, HAS_ALIBI=False)
    return compile_kernel(flash_bwd_kernel, tensors, consts, cfg, varlen)


def shipped_jobs():
    """(function, args) of every shipped forward and backward config's compile."""
    jobs = [(compile_fwd, (pad, causal, cfg, varlen)) for (pad, causal), cfg in configs.FWD_SM90.items()
            for varlen in (False, True)]
    jobs += [(compile_bwd, (pad, causal, cfg, varlen, atomic)) for (pad, causal), cfg in configs.BWD_SM90.items()
             for varlen in (False, True) for atomic in dict.fromkeys(("none", cfg.dq_atomic))]
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    jobs += [(compile_hopper_fwd, (head_dim, causal, cfg)) for (head_dim, causal), top in configs.FWD_HOPPER.items()
             if GLUON_VERSION_OK for cfg in configs.hopper_fwd_chain(top)]
    return jobs


def decode_launches():
    """Every split-KV decode launch the sm90 dispatch can pick (ops.kvcache_forward): (head dim, padded head dim,
    config, paged, read by TMA, query rows a program). A config of the contiguous tables also serves paged caches
    (pages that hold whole tiles as TMA boxes, else pointers) and caches no descriptor can address (a head dim that
    is not a multiple of 8, read by pointers); a program takes 16 rows up to the config's max_rows. Both ends are
    compiled where tiles come by TMA, max_rows alone by pointers (in the sweep that set max_rows, every compile
    failure and every shared-memory overflow came at more rows than a size that passed)."""
    cases = [(pad, cfg, paged, tma) for pad, cfg in dispatch.decode_configs_sm90()
             for paged, tma in (((False, True), (False, False), (True, True), (True, False)) if cfg.heads == 1
                                else ((False, True), ))]
    cases += [(pad, cfg, True, tile > 0) for pad, tile, cfg in dispatch.decode_paged_configs_sm90()]
    return [(pad if tma else pad - 5, pad, cfg, paged, tma, rows) for pad, cfg, paged, tma in cases
            for rows in sorted({16 if tma else cfg.max_rows, cfg.max_rows})]


def compile_decode(head_dim, pad, cfg, paged, tma, rows):
    """One decode launch with every option on (causal, window, left padding, ALiBi, softcap, LSE, several splits),
    in fp16; GQA 6 (a group that is not a power of two)."""
    consts = dict(GROUP=6, HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_M=rows, BLOCK_N=cfg.block_n, PAGED=paged,
                  USE_TMA=tma, MASK_LEFT=True, MASK_RIGHT=True, SPLIT=True, BLOCK_S=16,
                  MERGE_ROWS=merge_rows_per_step(16, pad), HAS_BATCH_IDX=not paged, HAS_LEFTPAD=True,
                  SOFTCAP=True, HAS_ALIBI=True, WRITE_LSE=True, DOT_PRECISION="tf32", KEY_GROUPS=cfg.key_groups,
                  HEADS=cfg.heads)
    tensors = dict(K=cfg.block_n, V=cfg.block_n) if tma else {}
    row = compile_kernel(flash_decode_split_kernel, tensors, consts, cfg, False, dtype="fp16", heads=cfg.heads)
    return dict(row, head_dim=head_dim, paged=paged, tma=tma, rows=rows)


def window_size(causal, window):
    """The launchers' (left, right) of a job: ``window`` where given (it replaces the causal flag's mask), else the
    causal flag's (checks.window)."""
    return window if window is not None else checks.window((-1, -1), causal)


def compile_hopper_fwd(head_dim, causal, cfg, seqlen=1024, window=None, packed=False, softcap=0.0):
    """The Gluon kernel, compiled from the launcher's own arguments on CPU tensors; ptxas (verbose) says
    whether it spilled or had to serialize the asynchronous wgmma. (A length of 1 arrives as a constant.)
    ``window``: a sliding window (left, right) instead of the causal flag's mask; ``packed``: two packed sequences;
    ``softcap``: flash-attn's (scores capped by tanh)."""
    import torch

    from flashtile.kernels.hopper import fwd as fwd_hopper
    from flashtile.kernels.hopper import fwd_launch

    q, k, v = (torch.empty(2, seqlen, 4, head_dim, dtype=torch.bfloat16) for _ in range(3))
    lse = torch.empty(2, 4, seqlen)
    sequences = (None, None, None)
    if packed:  # (total, nheads, headdim), the LSE (nheads, total)
        q, k, v, lse = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), lse.transpose(0, 1).flatten(1)
        cu_seqlens = torch.tensor([0, seqlen, 2 * seqlen], dtype=torch.int32)
        sequences = (cu_seqlens, cu_seqlens, seqlen)
    grid, args, kwargs = fwd_launch.launch_args(q, k, v, torch.empty_like(q), lse, *sequences, 0.1,
                                                window_size(causal, window), True, cfg, softcap=softcap)
    return dict(_compile_gluon(fwd_hopper.flash_fwd_hopper_kernel, args, kwargs), head_dim=head_dim,
                config=[v for f, v in cfg.__dict__.items() if f != "below"], causal=causal, q_regs=cfg.q_regs,
                window=window, varlen=packed, softcap=softcap)


def _backward_inputs(head_dim, nheads_k):
    """CPU tensors for the Gluon backward launchers: (q, k, lse), 8 query heads over ``nheads_k`` KV heads."""
    import torch
    q = torch.empty(2, 1024, 8, head_dim, dtype=torch.bfloat16)
    k = torch.empty(2, 1024, nheads_k, head_dim, dtype=torch.bfloat16)
    return q, k, torch.empty(2, 8, 1024)


def compile_hopper_bwd(causal, single_pass=False, head_dim=128, packed=False, window=None, softcap=0.0):
    """The Gluon dK/dV kernel (kernels/hopper/bwd.py) with its shipped config, GQA 8/2, as compile_hopper_fwd; with
    ``single_pass`` handing dS·K to the copy engine's reduce-add into a float32 dQ; ``packed``: on packed sequences
    (one pass); ``window``: a sliding window (left, right) instead of the causal flag's mask; ``softcap``:
    flash-attn's."""
    import torch

    from flashtile.kernels.hopper import bwd as bwd_hopper
    q, k, lse = _backward_inputs(head_dim, 2)
    config = configs.BWD_HOPPER[(head_dim_pad(head_dim), causal)]
    q, k, lse, sequences = _packed(q, k, lse) if packed else (q, k, lse, None)
    dq_acc = torch.empty(bwd_hopper.dq_acc_shape(q, config, sequences)) if single_pass else None
    grid, args, kwargs = bwd_hopper.launch_args(q, k, k, q, torch.empty_like(k), torch.empty_like(k), lse, lse, 0.1,
                                                window_size(causal, window), True, config, dq_acc, packed=sequences,
                                                softcap=softcap)
    row = _compile_gluon(bwd_hopper.flash_bwd_dkdv_hopper_kernel, args, kwargs)
    return dict(row, head_dim=head_dim, config=[], causal=causal, single_pass=single_pass, varlen=packed,
                window=window, softcap=softcap)


def compile_hopper_split(causal, nheads_k=2, head_dim=256, window=None, softcap=0.0, packed=False):
    """The Gluon dK/dV kernel of one warpgroup per gradient (kernels/hopper/bwd_split.py) with its shipped config,
    8 query heads over ``nheads_k`` KV heads (1 and 8 pass integers equal to 1, which arrive as constants);
    ``window``, ``softcap`` as launch_args's; ``packed``: two packed sequences."""
    import torch

    from flashtile.kernels.hopper import bwd_split as bwd_split_hopper
    q, k, lse = _backward_inputs(head_dim, nheads_k)
    config = configs.BWD_HOPPER[(head_dim_pad(head_dim), causal)]
    q, k, lse, sequences = _packed(q, k, lse) if packed else (q, k, lse, None)
    grid, args, kwargs = bwd_split_hopper.launch_args(q, k, k, q, torch.empty_like(k), torch.empty_like(k), lse, lse,
                                                      0.1, window_size(causal, window), True, config, softcap,
                                                      sequences)
    row = _compile_gluon(bwd_split_hopper.flash_bwd_dkdv_split_kernel, args, kwargs)
    return dict(row, head_dim=head_dim, config=[], causal=causal, nheads_k=nheads_k, window=window, softcap=softcap,
                varlen=packed)


def _packed(q, k, lse):
    """_backward_inputs' tensors as two packed sequences of 1024 rows: (total, nheads, headdim), the LSE (nheads,
    total), and the (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) the launchers take."""
    import torch
    cu_seqlens = torch.tensor([0, 1024, 2048], dtype=torch.int32)
    return q.flatten(0, 1), k.flatten(0, 1), lse.transpose(0, 1).flatten(1), (cu_seqlens, cu_seqlens, 1024, 1024)


def compile_hopper_dq(causal, config=None, head_dim=128, delta_in=False, window=None, softcap=0.0, packed=False):
    """The Gluon dQ kernel (kernels/hopper/bwd_dq.py), GQA 8/2, as compile_hopper_fwd: ``config`` (default the shipped
    one of the head dim); ``delta_in`` reads delta (− dLSE) instead of computing it; ``window`` as
    compile_hopper_bwd's; ``softcap``: flash-attn's; ``packed``: two packed sequences."""
    from flashtile.kernels.hopper import bwd_dq as bwd_dq_hopper
    config = config or configs.BWD_HOPPER[(head_dim_pad(head_dim), causal)].dq_hopper
    q, k, lse = _backward_inputs(head_dim, 2)
    q, k, lse, sequences = _packed(q, k, lse) if packed else (q, k, lse, None)
    grid, args, kwargs = bwd_dq_hopper.launch_args(q, k, k, q, q, q, lse, lse, 0.1, window_size(causal, window), True,
                                                   config, delta_in, softcap, sequences)
    return dict(_compile_gluon(bwd_dq_hopper.flash_bwd_dq_hopper_kernel, args, kwargs), head_dim=head_dim,
                config=list(config.__dict__.values()), causal=causal, window=window, softcap=softcap, varlen=packed)


def compile_hopper_decode(layout, config=None):
    """The Gluon decode kernel (kernels/hopper/decode.py), D=128, GQA 32/8, on a key- or head-major cache, as
    compile_hopper_fwd."""
    import torch

    from flashtile.kernels.hopper import decode as decode_hopper
    config = config or configs.DECODE_HOPPER[128]
    q = torch.empty(4, 1, 32, 128, dtype=torch.bfloat16)
    k = (torch.empty(4, 4096, 8, 128, dtype=torch.bfloat16) if layout == "key" else
         torch.empty(4, 8, 4096, 128, dtype=torch.bfloat16).transpose(1, 2))
    grid, args, kwargs = decode_hopper.launch_args(q, k, k, torch.empty(4, dtype=torch.int32), q,
                                                   torch.empty(4, 32, 1), 0.1, config)
    return dict(_compile_gluon(decode_hopper.flash_decode_hopper_kernel, args, kwargs), head_dim=128,
                config=list(config.__dict__.values()), causal=False, layout=layout)


PTX_SINK = None  # a list that _compile_gluon appends (kernel name, PTX) to, where one is set (tools/ptx_snapshot.py)


def _compile_gluon(kernel, args, kwargs):
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(TARGET)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    compiled = triton.compile(GluonASTSource(kernel, signature, constexprs, attrs), target=TARGET,
                              options=options.__dict__)
    ptx = compiled.asm["ptx"]
    if PTX_SINK is not None:
        PTX_SINK.append((kernel.__name__, ptx))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        report = subprocess.run([_ptxas(), "-arch=sm_90a", "-v", path, "-o", os.path.join(tmp, "kernel.cubin")],
                                capture_output=True, text=True).stderr
    spills = re.search(r"(\d+) bytes spill stores", report)
    return dict(kernel=kernel.__name__, varlen=False, dq=None, shared=compiled.metadata.shared,
                wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"),
                wgmma_rs=len(re.findall(r"wgmma\.mma_async[^;]*\},\s*\{", ptx)),  # A operand from registers
                tma_loads=len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared", ptx)),
                tma_3d=len(re.findall(r"cp\.async\.bulk\.tensor\.3d", ptx)),  # through 3-D (padded head dim) views
                tma_stores=len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global", ptx)),
                local=int(spills.group(1)) if spills else -1,
                tma_reduce=ptx.count("cp.reduce.async.bulk.tensor"), setmaxnreg=ptx.count("setmaxnreg"),
                clock_reads=ptx.count("%clock"),  # Proton's records (flashtile/viz/pipeline.py); none when off
                serialized="serialized" in report, atomics=ptx.count("atom.global") + ptx.count("red.global"),
                mbarrier_reuse=mbarrier_reuse(ptx),
                global_stores={"all": ptx.count("st.global"), "v2": ptx.count("st.global.v2"),
                               "v4": ptx.count("st.global.v4")})


def mbarrier_reuse(ptx):
    """Offsets of initialized mbarriers that a plain shared-memory access of the kernel may also touch. Triton may
    place a layout conversion's scratch in a barrier's bytes once the barrier is dead, and the PTX ISA leaves reusing
    an mbarrier's memory before mbarrier.inval undefined (docs/perf/forward.md, v33; triton's own pipelined loops
    invalidate theirs, so barriers with an mbarrier.inval count as released). A plain access at base offset
    c is taken to cover c up to the next base of its run (bases a power of two apart, as a scratch per warpgroup is
    laid out; between two such runs, the closer-spaced one), else 16 bytes (one vector store)."""
    lines = ptx.splitlines()
    consts = {}
    seen = {"init": set(), "inval": set()}  # offsets of barriers set up and of barriers released
    for line in lines:
        m = re.search(r"add\.s32\s+(%r\d+), %r\d+, (\d+);", line)
        if m:
            consts[m.group(1)] = int(m.group(2))
        m = re.search(r"mbarrier\.(init|inval)\S*\s+\[(%r\d+)\]", line)
        if m and m.group(2) in consts:
            seen[m.group(1)].add(consts[m.group(2)])
    barriers = seen["init"] - seen["inval"]
    bases = set()
    for line in lines:
        if "mbarrier" in line or not re.search(r"\b(st|ld)\.shared|ldmatrix|stmatrix", line):
            continue
        m = re.search(r"\[(%r\d+)(?:\+(\d+))?\]", line)
        if m and (m.group(2) or m.group(1) in consts):
            bases.add(int(m.group(2)) if m.group(2) else consts[m.group(1)])
    bases = sorted(bases)
    hits = set()
    gaps = [b - a for a, b in zip(bases, bases[1:])]
    for i, c in enumerate(bases):
        runs = [g for g in gaps[max(i - 1, 0):i + 1] if g & (g - 1) == 0]  # the gaps either side of c
        hits.update(b for b in barriers if c <= b < c + (min(runs) if runs else 16))
    return sorted(hits)


@contextlib.contextmanager
def proton_records(max_shared=232448):
    """Compiles in this block carry the Proton records of the kernels' ``pl.scope`` phases, as they do at a launch under
    proton.start(backend="instrumentation", mode=Default(buffer_type="global")) (no GPU here: its passes are set up
    by hand), into a private Triton cache: such a compile keeps the cache key of one without records."""
    from triton._C.libtriton import passes, proton
    from triton.backends import backends
    from triton.profiler import mode
    from triton.profiler.flags import flags
    from triton.profiler.hooks.instrumentation import Instrumentation

    records = mode.Default(buffer_type="global")

    def to_llvmir(pm):
        proton.add_convert_proton_to_protongpu(pm, records.metric_type, records.sampling_strategy,
                                               records.sampling_options, records.granularity, records.buffer_strategy,
                                               records.buffer_type, records.buffer_size, max_shared, 1, 128, True)
        passes.common.add_cse(pm)
        proton.add_allocate_proton_shared_memory(pm)

    def to_llvm(pm):
        proton.add_allocate_proton_global_scratch_buffer(pm)
        proton.add_convert_proton_nvidia_gpu_to_llvm(pm)
    compiler, cache = backends["nvidia"].compiler, triton.knobs.cache.dir
    with tempfile.TemporaryDirectory() as private:
        flags.instrumentation_on, triton.knobs.cache.dir = True, private
        compiler.instrumentation = Instrumentation({"ttgpuir_to_llvmir": to_llvmir, "llvmir_to_llvm": to_llvm})
        try:
            yield
        finally:
            flags.instrumentation_on, triton.knobs.cache.dir, compiler.instrumentation = False, cache, {}


def _ptxas():
    from triton.backends.nvidia import compiler
    return compiler.get_ptxas(90).path


def main(argv=None):
    """Compile one shard (``--shard K/N``: every N-th job from the K-th) of the shipped configs, or with ``--decode`` of
    the decode launches, and print the rows as JSON."""
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--decode", action="store_true")
    parser.add_argument("--shard", default="0/1")
    parser.add_argument("--proton", action="store_true",
                        help="the forward flashtile viz --pipeline --record runs, with Proton's records in it")
    args = parser.parse_args(argv)
    if args.proton:
        with proton_records():
            json.dump([compile_hopper_fwd(128, False, configs.FWD_HOPPER[(128, False)], 4096)], sys.stdout)
        return
    k, n = map(int, args.shard.split("/"))
    jobs = [(compile_decode, launch) for launch in decode_launches()] if args.decode else shipped_jobs()
    json.dump([fn(*fn_args) for fn, fn_args in jobs[k::n]], sys.stdout, indent=None)


if __name__ == "__main__":
    main()
