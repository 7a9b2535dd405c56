"""The kernel candidates that docs/perf describes as ready for a device call, each written as exact line replacements
in the tree's files (a candidate whose lines have changed fails loudly):

    PYTHONPATH=. python3 scripts/candidates.py apply NAME [NAME ...]     # rewrite the files in place
    PYTHONPATH=. python3 scripts/candidates.py bwd-ab [NAME ...] [bwd_hopper_ab.py's options]

``bwd-ab`` writes each backward candidate's kernels/hopper/bwd.py under /tmp/candidates and times them against the
tree's in one process (scripts/bwd_hopper_ab.py). A forward candidate is measured by running the GPU tests and
``python -m flashtile.bench --inputs ...`` before and after ``apply`` in one device call.

- dq_double (bwd.py): the dQ staging double-buffered per warpgroup, so a step waits only for the copy engine to have
  read the tile of two steps before (docs/perf/backward.md, run 44);
- mask_ragged (bwd.py): non-causal P masked by the key bound only on a tile that passes it, at D=128 (run 44);
- headroom (fwd.py and its test): FROZEN_MAX keeps the reference 48 log2 units above a row's sum from the second
  K/V tile on, so a key may score about 160 log2 units above the row's largest before P overflows, not about 112
  (docs/perf/forward.md, run 44).
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BWD, FWD = "flashtile/kernels/hopper/bwd.py", "flashtile/kernels/hopper/fwd.py"

CANDIDATES = {
    "dq_double": {BWD: [
        ("def _dq_reduce(dq, dq_smem, dQacc, row, half: gl.constexpr):",
         "def _dq_reduce(dq, dq_smem, dQacc, row, buf):"),
        ("    dq_buf = dq_smem.index(half)\n    tma.store_wait(0)  # the copy engine has read the previous tile",
         "    dq_buf = dq_smem.index(buf)\n    tma.store_wait(TILES)  # the copy engine has read the tile of two steps "
         "before"),
        ("_dq_reduce(dq, smem.dq, dQacc, tile_row + half * 2 * DQ_COLS, half)",
         "_dq_reduce(dq, smem.dq, dQacc, tile_row + half * 2 * DQ_COLS, (t % 2) * 2 + half)"),
        ("gl.allocate_shared_memory(gl.float32, [BUFS, BLOCK_M // 64 * HEAD_DIM, 32], DQ_TILE_LAYOUT)",
         "gl.allocate_shared_memory(gl.float32, [2 * BUFS, BLOCK_M // 64 * HEAD_DIM, 32], DQ_TILE_LAYOUT)"),
    ]},
    "mask_ragged": {BWD: [
        ("        else:  # kept even where no tile passes the keys: without it ptxas spills more (180 B vs 108)\n"
         "            p_t = gl.where((offs_n < seqlen_k)[:, None], p_t, 0.0)",
         "        elif sw.HEAD_DIM > 64:  # D=64 keeps the mask on every tile (without it, it spills)\n"
         "            if last_key >= seqlen_k:\n"
         "                p_t = gl.where((offs_n < seqlen_k)[:, None], p_t, 0.0)\n"
         "        else:\n"
         "            p_t = gl.where((offs_n < seqlen_k)[:, None], p_t, 0.0)"),
    ]},
    "headroom": {FWD: [
        ("REBASE_AT = gl.constexpr(2.0**16)  # FROZEN_MAX: a row sum at this moves the row's reference up (_rebase) "
         "...\nREBASE_EVERY = gl.constexpr(8)  # ... at every REBASE_EVERY-th K/V tile of an item, and after its last",
         "HEADROOM = gl.constexpr(48)  # FROZEN_MAX: a rebased row's sum is about 2^-HEADROOM (P's room to grow)\n"
         "REBASE_AT = gl.constexpr(2.0**-32)  # FROZEN_MAX: a row sum at this moves the row's reference up ...\n"
         "REBASE_EVERY = gl.constexpr(8)  # ... at an item's 2nd K/V tile and every REBASE_EVERY-th after, and at "
         "its end"),
        ("take a reference ⌊log2 l⌋ higher (l from a quad's\n    largest share)",
         "take a reference ⌊log2 l⌋ + HEADROOM higher (l from a\n    quad's largest share)"),
        ("    e = gl.where(l_row >= REBASE_AT, gl.minimum((l_row.to(gl.int32, bitcast=True) >> 23) - 127, 126), 0)  "
         "# [WG_M]",
         "    e = gl.where(l_row >= REBASE_AT, gl.minimum((l_row.to(gl.int32, bitcast=True) >> 23) - 127 + HEADROOM, "
         "126),\n                 0)  # [WG_M]"),
        ("                if j % REBASE_EVERY == 0:\n                    m_ref, l_i, alpha = _rebase(m_ref, l_i)",
         "                if j % REBASE_EVERY == 1:\n                    m_ref, l_i, alpha = _rebase(m_ref, l_i)"),
        ("            elif j % REBASE_EVERY == 0:  # O up to tile j - 1 joins its rows' new reference",
         "            elif j % REBASE_EVERY == 1:  # O up to tile j - 1 joins its rows' new reference"),
    ], "tests/test_gpu_fwd.py": [
        ("falls back. \"dominant\": one key (the middle one) 150 log2 units above the rest in KV head 0's query heads, "
         "where P\n    overflows float32, so those rows fall back",
         "falls back. \"dominant\": one key (the middle one) 140 log2 units above the rest in KV head 0's query heads "
         "(P\n    stays finite, nothing falls back); \"past\": 220 above, where P overflows float32, so those rows "
         "fall back\n   "),
        ("    rises = ((0, 100.0), (1, 40.0)) if kind == \"rising\" else ((0, 150.0), )",
         "    rises = {\"rising\": ((0, 100.0), (1, 40.0)), \"dominant\": ((0, 140.0), ), "
         "\"past\": ((0, 220.0), )}[kind]"),
        ("    assert fell_back == (kind == \"dominant\"),", "    assert fell_back == (kind == \"past\"),"),
        ("        check_rising_scores(head_dim, causal, \"dominant\")",
         "        check_rising_scores(head_dim, causal, \"dominant\")\n"
         "        check_rising_scores(head_dim, causal, \"past\")"),
    ]},
}


def build(name, path, text):
    """``text`` (the tree's ``path``) with candidate ``name``'s replacements for that file, each made once."""
    for old, new in CANDIDATES[name][path]:
        if text.count(old) != 1:
            raise SystemExit(f"{name}: the lines it replaces are not in {path} once: {old.splitlines()[0]!r}")
        text = text.replace(old, new)
    return text


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("apply", "bwd-ab"):
        raise SystemExit(__doc__)
    names = [a for a in sys.argv[2:] if a in CANDIDATES]
    rest = [a for a in sys.argv[2:] if a not in CANDIDATES]
    if sys.argv[1] == "apply":
        for name in names:
            for path in CANDIDATES[name]:
                file = ROOT / path
                file.write_text(build(name, path, file.read_text()))
        return
    out = Path("/tmp/candidates")
    out.mkdir(exist_ok=True)
    files = []
    for name in names or [n for n in CANDIDATES if BWD in CANDIDATES[n]]:
        files.append(out / f"{name}.py")
        files[-1].write_text(build(name, BWD, (ROOT / BWD).read_text()))
    sys.exit(subprocess.call([sys.executable, str(ROOT / "scripts" / "bwd_hopper_ab.py"), "--old", *map(str, files),
                              *rest]))


if __name__ == "__main__":
    main()
