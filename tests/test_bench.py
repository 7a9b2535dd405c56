"""The benchmark's report (no GPU needed)."""
from flashtile.bench.__main__ import table


def test_ratio_is_against_other_libraries_not_our_variants():
    shape = dict(head_dim=128, causal=True, seqlen=2048, batch=8, nheads=16)
    rows = [dict(shape, peer="flashtile", tflops=310.0), dict(shape, peer="flashtile (portable)", tflops=449.0),
            dict(shape, peer="FlexAttention", tflops=310.0 / 0.97)]
    line = table(rows, ["flashtile", "flashtile (portable)", "FlexAttention"]).splitlines()[-1]
    assert line.endswith("| 0.97 |"), line
