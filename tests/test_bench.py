"""The benchmark's report (no GPU needed)."""
from flashtile.bench.__main__ import table


def test_ratio_is_against_other_libraries_not_our_variants():
    shape = dict(head_dim=128, causal=True, seqlen=2048, batch=8, nheads=16)
    rows = [dict(shape, peer="flashtile", tflops=310.0), dict(shape, peer="flashtile (portable)", tflops=449.0),
            dict(shape, peer="FlexAttention", tflops=310.0 / 0.97)]
    line = table(rows, ["flashtile", "flashtile (portable)", "FlexAttention"]).splitlines()[-1]
    assert line.endswith("| 0.97 |"), line


def test_best_of_turns_keeps_each_keys_lowest_time_and_takes_turns():
    from flashtile.bench.__main__ import best_of_turns
    calls, times = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 6.0, 4.0])}

    def timer(key):
        def run():
            calls.append(key)
            return next(times[key]), None
        return run
    errors = iter([(None, "OOM"), (None, "OOM"), (2.5, None)])
    best = best_of_turns({"a": timer("a"), "b": timer("b"), "c": lambda: next(errors)}, rounds=3)
    assert calls == ["a", "b"] * 3  # in turn, not one key's rounds back to back
    assert best == {"a": (1.0, None), "b": (4.0, None), "c": (2.5, None)}
    assert best_of_turns({"d": lambda: (None, "OOM")}, rounds=2) == {"d": (None, "OOM")}


def test_error_text_is_one_line_even_for_an_empty_message():
    from flashtile.bench.__main__ import error_text
    assert error_text(AssertionError()) == "AssertionError: "
    assert error_text(ValueError("first line\nsecond"), 5) == "ValueError: first"


def test_tune_refuses_peers_for_the_backward_before_touching_a_gpu(capsys):
    import pytest
    from flashtile.bench.tune import main
    with pytest.raises(SystemExit) as exit_info:
        main(["--backward", "--peers", "cuDNN"])
    assert exit_info.value.code == 2 and "--peers" in capsys.readouterr().err


def test_tune_labels_say_what_each_hopper_candidate_changes():
    from flashtile.bench.tune import HOPPER_CANDIDATES, _label
    labels = [_label(c) for c in HOPPER_CANDIDATES]
    assert len(set(labels)) == len(labels)  # no two candidates print the same row name
    assert "192,128 x3 regs 160 ping-pong persistent" in labels
