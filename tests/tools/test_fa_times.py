"""tools/fa_times.py: the summary of a flash-attn tests call's per-case seconds (FA_TIMES lines)."""
import sys

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import fa_times  # noqa: E402


def test_summary_splits_compiling_from_the_rest():
    lines = ["test_flash_attn.py::test_flash_attn_output[a]\t10.0\t8.0\n",
             "test_flash_attn.py::test_flash_attn_output[b]\t2.0\t0.0\n",
             "test_flash_attn.py::test_flash_attn_kvcache[c]\t5.0\t1.0\n",
             "a line cut short by the timeout\t1.0\n"]
    out = fa_times.summary(lines, top=2)
    assert out[0] == "3 cases, 17 s in all (summed over workers), 9 s compiling (53 %)"
    assert "| test_flash_attn_output | 2 | 12 | 8 |" in out and "| test_flash_attn_kvcache | 1 | 5 | 1 |" in out
    assert out[-2:] == ["  4.0 5.0 test_flash_attn.py::test_flash_attn_kvcache[c]",
                        "  2.0 10.0 test_flash_attn.py::test_flash_attn_output[a]"]
