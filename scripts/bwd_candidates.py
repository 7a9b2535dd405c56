"""The sm90 backward's candidates that docs/perf/backward.md describes as ready for a device call, each built from
kernels/hopper/bwd.py by replacing exact lines (a candidate whose lines have changed fails loudly), written under
``--out`` and timed against the file as it is, in one process:

    PYTHONPATH=. python3 scripts/bwd_candidates.py [--out /tmp/bwd_candidates] [bwd_hopper_ab.py's options]

- dq_double: the dQ staging double-buffered per warpgroup (the copy engine reads step t's tile while step t + 1's
  is stored);
- mask_ragged: non-causal P masked by the key bound only on a tile that passes it.
"""
import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "flashtile" / "kernels" / "hopper" / "bwd.py"

CANDIDATES = {
    "dq_double": [
        ("def _dq_reduce(dq, dq_smem, dQacc, row, half: gl.constexpr):",
         "def _dq_reduce(dq, dq_smem, dQacc, row, buf):"),
        ("    dq_buf = dq_smem.index(half)\n    tma.store_wait(0)  # the copy engine has read the previous tile",
         "    dq_buf = dq_smem.index(buf)\n    tma.store_wait(TILES)  # the copy engine has read the tile of two steps "
         "before"),
        ("_dq_reduce(dq, smem.dq, dQacc, tile_row + half * 2 * DQ_COLS, half)",
         "_dq_reduce(dq, smem.dq, dQacc, tile_row + half * 2 * DQ_COLS, (t % 2) * 2 + half)"),
        ("gl.allocate_shared_memory(gl.float32, [BUFS, BLOCK_M // 64 * HEAD_DIM, 32], DQ_TILE_LAYOUT)",
         "gl.allocate_shared_memory(gl.float32, [2 * BUFS, BLOCK_M // 64 * HEAD_DIM, 32], DQ_TILE_LAYOUT)"),
    ],
    "mask_ragged": [
        ("        else:  # kept even where no tile passes the keys: without it ptxas spills more (180 B vs 108)\n"
         "            p_t = gl.where((offs_n < seqlen_k)[:, None], p_t, 0.0)",
         "        elif sw.HEAD_DIM > 64:  # D=64 keeps the mask on every tile (without it, it spills)\n"
         "            if last_key >= seqlen_k:\n"
         "                p_t = gl.where((offs_n < seqlen_k)[:, None], p_t, 0.0)\n"
         "        else:\n"
         "            p_t = gl.where((offs_n < seqlen_k)[:, None], p_t, 0.0)"),
    ],
}


def build(name, source):
    """The candidate's source: each (old, new) of CANDIDATES[name] replaced once."""
    for old, new in CANDIDATES[name]:
        if source.count(old) != 1:
            raise SystemExit(f"{name}: the lines it replaces are not in bwd.py once: {old.splitlines()[0]!r}")
        source = source.replace(old, new)
    return source


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/bwd_candidates")
    parser.add_argument("--only", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES))
    args, rest = parser.parse_known_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    source = SOURCE.read_text()
    paths = []
    for name in args.only:
        path = out / f"{name}.py"
        path.write_text(build(name, source))
        paths.append(str(path))
    sys.exit(subprocess.call([sys.executable, str(ROOT / "scripts" / "bwd_hopper_ab.py"), "--old", *paths, *rest]))


if __name__ == "__main__":
    main()
