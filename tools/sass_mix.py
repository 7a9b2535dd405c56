"""Instruction mix of the sm90 Hopper forward for one config, compiled here (no GPU: ptxas and cuobjdump ship
with triton): how many SFU exponentials, FP32 and integer instructions the two consumers' code holds.

    TRITON_INTERPRET=0 python tools/sass_mix.py --head-dim 128 [--causal]
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


def sass_of(head_dim, causal, cfg):
    """Compile through compile_sm90's path, keeping the cubin that its ptxas call writes, and disassemble."""
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
            compile_sm90.compile_hopper_fwd(head_dim, causal, cfg)
        finally:
            subprocess.run = run
        cuobjdump = os.path.join(os.path.dirname(compile_sm90._ptxas()), "cuobjdump")
        return subprocess.run([cuobjdump, "-sass", kept], capture_output=True, text=True, check=True).stdout


def key_loops(sass):
    """The K/V loops of the consumers in disassembled SASS: every backward branch's body of under 800 instructions
    that holds one tile step's exponentials and matrix products (32+ MUFU.EX2, 4+ HGMMA; a work item's loop is
    thousands long), as (first address, last address, local-memory loads and stores in it)."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = []
    for addr, text in ins:
        m = re.search(r"BRA (?:`\(.*?\) )?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            if len(body) < 800 and sum("MUFU.EX2" in t for t in body) >= 32 and sum("HGMMA" in t for t in body) >= 4:
                loops.append((int(m.group(1), 16), addr, sum(bool(re.search(r"\b(LDL|STL)\b", t)) for t in body)))
    return loops


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    sass = sass_of(args.head_dim, args.causal, configs.FWD_HOPPER[(args.head_dim, args.causal)])
    ops = collections.Counter(m.group(1).split(".")[0] for m in
                              re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass))
    print("| " + " | ".join(OPS) + " |")
    print("|---" * len(OPS) + "|")
    print("| " + " | ".join(str(ops[op]) for op in OPS) + " |")


if __name__ == "__main__":
    main()
