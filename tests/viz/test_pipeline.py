"""flashtile/viz/pipeline.py: Proton's trace of the sm90 forward turned into ours, the numbers read off it, and the
recording itself (GPU tier)."""
import json

import pytest
from pipeline_traces import CONSUMER, LOADER, META, program, proton_trace

from flashtile.viz import pipeline


def test_from_proton_keeps_the_loader_and_a_warp_of_each_consumer():
    trace = pipeline.from_proton(proton_trace({0: program(3), 1: program(0), 2: program(0)}), META, programs=2)
    assert [p["cta"] for p in trace["programs"]] == [0, 1]
    for p in trace["programs"]:
        assert [(lane["role"], lane["warp"]) for lane in p["lanes"]] == [("loader", 8), ("consumer 0", 0),
                                                                        ("consumer 1", 4)]
        loader, first, second = p["lanes"]
        assert [(trace["scopes"][s], a, b) for s, a, b in loader["events"]] == LOADER  # from the program's first record
        assert [(trace["scopes"][s], a, b) for s, a, b in first["events"]] == CONSUMER
        assert second["events"][0][1:] == [20, 34]
    json.dumps(trace)


def test_a_trace_without_our_scopes_is_refused():
    with pytest.raises(RuntimeError, match="instrumentation"):
        pipeline.from_proton(proton_trace({0: {0: [("some other scope", 0, 5)]}}), META)


def test_summary_reads_the_numbers_off_the_trace():
    """By hand: products are in flight 20-40 and 60-110 on the first consumer, 40-60 and 80-130 on the second, so
    110 of the program's 140 cycles; each consumer waits 6 + 0 cycles for its two K/V tiles, spends 40 of 140 in the
    softmax; the loader's three waits for a free stage take 6, 2 and 34."""
    trace = pipeline.from_proton(proton_trace({0: program(0)}), META)
    numbers = pipeline.summary(trace)["programs"][0]
    assert numbers["span_us"] == pytest.approx(0.140)
    assert numbers["tensor_busy"] == pytest.approx(110 / 140)
    assert numbers["kv_waits"] == 2
    assert numbers["kv_wait_ns"] == pytest.approx(3.0)
    assert numbers["kv_wait_share"] == pytest.approx(6 / 140)
    assert numbers["softmax_share"] == pytest.approx(40 / 140)
    assert numbers["turn_wait_share"] == 0
    assert numbers["stage_wait_ns"] == pytest.approx(42 / 3)


def test_a_missing_trace_says_how_to_record_one(tmp_path, monkeypatch, capsys):
    from flashtile import cli
    monkeypatch.setattr(pipeline, "SHIPPED", tmp_path / "none.json")
    with pytest.raises(SystemExit):
        cli.main(["viz", "--pipeline", "-o", str(tmp_path / "p.html")])
    assert "flashtile viz --pipeline --record" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["viz", "--record", "-o", str(tmp_path / "p.html")])
    assert "--record goes with --pipeline" in capsys.readouterr().err


def test_the_shipped_trace_is_a_recording_of_the_forward():
    """flashtile/viz/pipeline_trace.json, recorded on the device (`flashtile viz --pipeline --record`), ships with the
    package: the page works without a GPU."""
    trace = pipeline.load()
    assert trace["meta"]["kernel"] == "hopper/fwd.py" and trace["programs"]
    for p in trace["programs"]:
        roles = [lane["role"] for lane in p["lanes"]]
        assert roles[0] == "loader" and roles[1:] == [f"consumer {i}" for i in range(len(roles) - 1)]
    numbers = pipeline.summary(trace)["mean"]
    assert 0 < numbers["tensor_busy"] <= 1 and numbers["kv_waits"] > 0


@pytest.mark.gpu
def test_record(tmp_path):
    """One recorded launch of the sm90 forward: a loader and two consumer warpgroups; a consumer waits 33 times for
    K/V in each item (4096 keys: 32 tiles of 128, K of the first, K and V of the next in each step, the last V)."""
    import torch
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 forward")
    trace = pipeline.record(tmp_path / "trace.json")
    assert json.loads((tmp_path / "trace.json").read_text()) == trace
    for p in trace["programs"]:
        assert [lane["role"] for lane in p["lanes"]] == ["loader", "consumer 0", "consumer 1"]
    numbers = pipeline.summary(trace)
    assert all(row["kv_waits"] % 33 == 0 and row["kv_waits"] > 0 for row in numbers["programs"])
    assert 0 < numbers["mean"]["tensor_busy"] <= 1
