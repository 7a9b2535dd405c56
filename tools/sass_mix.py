"""Instruction mix of an sm90 Gluon kernel for one config, compiled here (no GPU: ptxas and cuobjdump ship with
triton): how many SFU exponentials, FP32 and integer instructions the code holds; with ``--loops``, each innermost
loop of the kernel (a consumer's step) with its instruction count, exponentials, matrix products, local-memory
traffic and its most frequent instructions.

    TRITON_INTERPRET=0 python tools/sass_mix.py --head-dim 128 [--causal] [--kernel fwd|bwd|split] [--loops]

``bwd``: the one-pass dK/dV kernel (kernels/hopper/bwd.py, its shipped config); ``split``: D=256's one warpgroup per
gradient (kernels/hopper/bwd_split.py).
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import compile_sm90  # noqa: E402

from flashtile import configs  # noqa: E402

OPS = ["MUFU", "FFMA", "FADD", "FMUL", "FMNMX", "LEA", "IMAD", "F2FP", "HGMMA"]


def sass_of(head_dim, causal, cfg, kernel="fwd"):
    """Compile through compile_sm90's path, keeping the cubin that its ptxas call writes, and disassemble (``cfg``
    only for the forward; the backward kernels take their shipped configs)."""
    run = subprocess.run
    with tempfile.TemporaryDirectory() as tmp:
        kept = os.path.join(tmp, "kept.cubin")

        def keep(cmd, **kwargs):
            result = run(cmd, **kwargs)
            if isinstance(cmd, list) and "-v" in cmd and "-o" in cmd:
                subprocess.run(["cp", cmd[cmd.index("-o") + 1], kept], check=True)
            return result
        subprocess.run = keep
        try:
            if kernel == "fwd":
                compile_sm90.compile_hopper_fwd(head_dim, causal, cfg)
            elif kernel == "bwd":
                compile_sm90.compile_hopper_bwd(causal, single_pass=True, head_dim=head_dim)
            else:
                compile_sm90.compile_hopper_split(causal, head_dim=head_dim)
        finally:
            subprocess.run = run
        cuobjdump = os.path.join(os.path.dirname(compile_sm90._ptxas()), "cuobjdump")
        return subprocess.run([cuobjdump, "-sass", kept], capture_output=True, text=True, check=True).stdout


def _instructions(sass):
    """(address, instruction text) of each instruction in disassembled SASS."""
    return [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]


def _back_edges(ins):
    """(target, address) of every branch to an earlier address: a loop's span."""
    edges = []
    for addr, text in ins:
        target = re.search(r"BRA (?:`\(.*?\) )?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            edges.append((int(target.group(1), 16), addr))
    return edges


def _local(body):
    return sum(bool(re.search(r"\b(LDL|STL)\b", t)) for t in body)


def key_loops(sass):
    """The K/V loops of the consumers in disassembled SASS: every backward branch's body of under 800 instructions
    that holds one tile step's exponentials and matrix products (32+ MUFU.EX2, 4+ HGMMA; a work item's loop is
    thousands long), as (first address, last address, local-memory loads and stores in it)."""
    ins = _instructions(sass)
    loops = []
    for start, end in _back_edges(ins):
        body = [t for a, t in ins if start <= a <= end]
        if len(body) < 800 and sum("MUFU.EX2" in t for t in body) >= 32 and sum("HGMMA" in t for t in body) >= 4:
            loops.append((start, end, _local(body)))
    return loops


def _opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def inner_loops(sass):
    """Every innermost loop of over 40 instructions, as (first address, instructions) in program order: a backward
    branch's span with no other loop's back edge inside it (ptxas lays some code out past a loop's back edge, so spans
    overlap without nesting; the waits' short spin loops do not count)."""
    ins = _instructions(sass)
    spans = _back_edges(ins)
    inner = [(a, b) for a, b in spans if not any((c, d) != (a, b) and a < d < b and d - c > 0x100 for c, d in spans)]
    loops = [(a, [t for x, t in ins if a <= x <= b]) for a, b in sorted(set(inner))]
    return [(a, body) for a, body in loops if len(body) > 40]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--kernel", choices=["fwd", "bwd", "split"], default="fwd")
    parser.add_argument("--loops", action="store_true")
    args = parser.parse_args()
    cfg = configs.FWD_HOPPER[(args.head_dim, args.causal)] if args.kernel == "fwd" else None
    sass = sass_of(args.head_dim, args.causal, cfg, args.kernel)
    ops = collections.Counter(m.group(1).split(".")[0] for m in
                              re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass))
    print("| " + " | ".join(OPS) + " |")
    print("|---" * len(OPS) + "|")
    print("| " + " | ".join(str(ops[op]) for op in OPS) + " |")
    if args.loops:
        print("\n| loop at | instructions | MUFU | HGMMA | local ld/st | most frequent |\n|---|---|---|---|---|---|")
        for start, body in inner_loops(sass):
            mix = collections.Counter(_opcode(t) for t in body)
            top = ", ".join(f"{op} {n}" for op, n in mix.most_common(6))
            print(f"| {start:#x} | {len(body)} | {mix['MUFU']} | {mix['HGMMA']} | {_local(body)} | {top} |")


if __name__ == "__main__":
    main()
