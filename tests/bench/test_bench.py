"""The benchmark's report (no GPU needed)."""
import json

import pytest
import torch
from helpers import ROOT

from flashtile.bench.__main__ import table


def test_ratio_is_against_other_libraries_not_our_variants():
    shape = dict(head_dim=128, causal=True, seqlen=2048, batch=8, nheads=16)
    rows = [dict(shape, peer="flashtile", tflops=310.0), dict(shape, peer="flashtile (portable)", tflops=449.0),
            dict(shape, peer="FlexAttention", tflops=310.0 / 0.97)]
    line = table(rows, ["flashtile", "flashtile (portable)", "FlexAttention"]).splitlines()[-1]
    assert line.endswith("| 0.97 |"), line


def test_ratio_compares_the_first_peers_setting():
    """Capped flashtile listed first meets the capped peers only; plain flashtile listed first, the plain ones."""
    shape = dict(head_dim=128, causal=False, seqlen=4096, batch=4, nheads=16)
    rows = [dict(shape, peer="flashtile (softcap 50)", tflops=500.0), dict(shape, peer="FA4 (softcap 50)",
                                                                         tflops=400.0),
            dict(shape, peer="flashtile", tflops=700.0), dict(shape, peer="FA4", tflops=500.0)]
    capped = table(rows, ["flashtile (softcap 50)", "FA4 (softcap 50)", "flashtile", "FA4"]).splitlines()[-1]
    assert capped.endswith("| 1.25 |"), capped
    plain = table(rows, ["flashtile", "FA4", "flashtile (softcap 50)", "FA4 (softcap 50)"]).splitlines()[-1]
    assert plain.endswith("| 1.40 |"), plain


def test_every_capped_peer_names_its_setting():
    """Each peer with a setting is one the bench runs, and each peer the bench runs with a cap has that setting."""
    from flashtile.bench.peers import FORWARD, SETTING, setting
    assert set(SETTING) <= set(FORWARD)
    assert {p for p in FORWARD if "softcap" in p} == set(SETTING)
    assert setting("FA4") == "" and setting("FA4 (softcap 50)") == "softcap 50"


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
    assert calls == ["a", "b", "b", "a", "a", "b"]  # rounds a b c, b c a, c a b: in turn, each starting one later
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


def test_ncu_decode_summary_takes_each_kernels_first_value(tmp_path, capsys):
    """tools/ncu_decode.py --summarize: one row per kernel of ncu's details CSV, the first value of a metric
    that ncu lists twice (Duration in two sections), '–' for one it lacks."""
    import importlib.util
    path = ROOT / "tools" / "ncu_decode.py"
    spec = importlib.util.spec_from_file_location("ncu_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = tmp_path / "dec.csv"
    report.write_text('"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
                      '"0","flash_decode_split_kernel(...)","SOL","Duration","us","926.88"\n'
                      '"0","flash_decode_split_kernel(...)","SOL","DRAM Throughput","%","96.37"\n'
                      '"0","flash_decode_split_kernel(...)","Other","Duration","us","1.0"\n'
                      '"1","cudnn_kernel","SOL","Duration","us","925.57"\n')
    module.summarize([str(report)])
    rows = [line for line in capsys.readouterr().out.splitlines() if "dec.csv" in line]
    assert len(rows) == 2
    assert "| flash_decode_split_kernel | 926.88 us | 96.37 % | –" in rows[0]
    assert "| cudnn_kernel | 925.57 us | – |" in rows[1]


def test_fwd_variants_sets_fields_and_runs_hopper_everywhere():
    """tools/fwd_variants.py: --set changes the shipped configs of that head dim, --hopper-everywhere drops
    min_seqlen_q (the top config runs at every length) and gives a causal head dim without a config a
    two-warpgroup one; other head dims untouched."""
    import importlib.util

    from flashtile import configs
    path = ROOT / "tools" / "fwd_variants.py"
    spec = importlib.util.spec_from_file_location("fwd_variants", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = dict(configs.FWD_HOPPER)
    shipped = table[(64, False)]
    assert shipped.min_seqlen_q > 0
    got = module.variant_configs(table, 64, True, ["num_stages=2"])
    assert set(got) == {(64, False), (64, True)}
    assert got[(64, False)].min_seqlen_q == got[(64, True)].min_seqlen_q == 0 and got[(64, False)].num_stages == 2
    assert got[(64, False)].block_m == shipped.block_m and got[(64, True)].block_m == table[(64, True)].block_m
    no_causal = {key: cfg for key, cfg in table.items() if key != (64, True)}
    assert module.variant_configs(no_causal, 64, True, [])[(64, True)].block_m == 128
    assert module.variant_configs(table, 128, False, []) == {k: v for k, v in table.items() if k[0] == 128}
    tables = module.variant_tables(table, 128, False, ["num_stages=2"], [["shipped"], ["flat", "persistent=0"]])
    assert list(tables) == ["shipped", "flat"]
    assert {c.num_stages for t in tables.values() for c in t.values()} == {2}  # --variant on top of --set
    assert [c.persistent for c in tables["flat"].values()] == [False, False]
    assert tables["shipped"][(128, False)].persistent == table[(128, False)].persistent
    assert table == configs.FWD_HOPPER  # the table itself is left alone


def test_decode_bench_table_ratio():
    """The decode bench's table: each peer's TB/s (µs), flashtile / cuDNN as cuDNN's time over ours."""
    from flashtile.bench.decode import table
    rows = [dict(layout="key", batch=8, seqlen=4096, peer="flashtile", us=10.0, tbps=2.0, graph_us=7.5),
            dict(layout="key", batch=8, seqlen=4096, peer="cuDNN", us=11.0, tbps=1.8),
            dict(layout="key", batch=8, seqlen=4096, peer="FA2 (SDPA flash)", error="refused")]
    lines = table(rows).splitlines()
    assert lines[0].startswith("| B | L | flashtile TB/s (µs) | cuDNN TB/s (µs) | FA2 (SDPA flash) TB/s (µs) |")
    assert lines[2] == "| 8 | 4096 | 2.00 (10.0) | 1.80 (11.0) | refused | 1.100 | 7.5 | – | – |"


def test_decode_bench_replots_a_saved_run(tmp_path):
    """``python -m flashtile.bench.decode --replot decode.json`` draws decode.png from a saved run, without a GPU: a
    panel per layout, peers that did not run left out."""
    pytest.importorskip("matplotlib")
    from flashtile.bench.decode import main
    rows = [dict(layout=layout, batch=b, seqlen=n, peer=peer, us=10.0, tbps=1.0 + b / 8 + n / 8192)
            for layout in ("head", "key") for b in (1, 8) for n in (4096, 8192) for peer in ("flashtile", "cuDNN")]
    rows.append(dict(layout="key", batch=8, seqlen=4096, peer="FA2 (SDPA flash)", error="refused"))
    saved = tmp_path / "decode.json"
    saved.write_text(json.dumps(rows))
    main(["--replot", str(saved), "--out", str(tmp_path / "plots")])
    png = (tmp_path / "plots" / "decode.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


@pytest.mark.parametrize("page_size", [16, 64])
def test_paged_cache_reads_back_the_cache(page_size):
    """The decode probes' and tests' paged caches: every page once, shuffled, the pool read through the table is the
    cache; a second call given the table (V beside K) lays its cache out the same way, spares filled as asked."""
    from flashtile.bench.decode import paged_cache
    k, v = torch.randn(3, 128, 2, 8), torch.randn(3, 128, 2, 8)
    pool, table = paged_cache(k, page_size, spare_pages=2)
    assert table.dtype == torch.int32 and table.shape == (3, 128 // page_size) and pool.shape[0] == table.numel() + 2
    assert len(set(table.flatten().tolist())) == table.numel()  # every page once
    assert not torch.equal(table.flatten(), torch.arange(table.numel(), dtype=torch.int32))  # shuffled
    assert torch.equal(pool[table.long()].flatten(1, 2), k)
    v_pool, same = paged_cache(v, page_size, spare_pages=2, table=table, fill=float("inf"))
    assert same is table and torch.equal(v_pool[table.long()].flatten(1, 2), v)
    spare = torch.ones(pool.shape[0], dtype=torch.bool)
    spare[table.flatten().long()] = False
    assert bool(torch.isinf(v_pool[spare]).all())


def test_paired_interval_holds_the_median():
    """tools/decode_paired.py: the bootstrap interval of the median ratio is a point for equal ratios and brackets
    the median of spread ones."""
    import importlib.util
    import statistics
    path = ROOT / "tools" / "decode_paired.py"
    spec = importlib.util.spec_from_file_location("decode_paired", path)
    paired = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paired)
    assert paired.interval([0.997] * 10) == (0.997, 0.997)
    ratios = [0.99 + 0.001 * i for i in range(21)]
    lo, hi = paired.interval(ratios)
    assert lo < statistics.median(ratios) < hi and hi - lo < 0.02


@pytest.mark.parametrize("kind", ["random", "large", "rising", "falling", "dominant"])
def test_input_distributions_shape_the_scores_as_named(kind):
    """flashtile/bench/inputs.py: the scores (softmax_scale 1/sqrt(D)) of each distribution: rising has each row's
    last keys tens of nats above its first, falling the reverse, dominant one key far above the rest, large scores
    several times random's; GQA shapes."""
    from flashtile.bench import inputs
    torch.manual_seed(0)
    q, k, v = inputs.make(kind, 2, 256, 4, 64, device="cpu", dtype=torch.float32, nheads_k=2)
    assert q.shape == (2, 256, 4, 64) and k.shape == v.shape == (2, 256, 2, 64)
    s = torch.einsum("bihd,bjhd->bhij", q[:, :, :2], k) / 8  # [batch, head, query, key]
    first, last = s[..., :32].amax(-1), s[..., -32:].amax(-1)
    spread = s.std().item()
    if kind == "rising":
        assert (last - first).min() > 30
    elif kind == "falling":
        assert (first - last).min() > 30
    elif kind == "dominant":
        others = torch.cat([s[..., :128], s[..., 129:]], -1).amax(-1)
        assert (s[..., 128] - others).mean() > 45 and (s[..., 128] - others).min() > 20
    elif kind == "large":
        assert spread > 8
    else:
        assert 0.5 < spread < 2 and (last - first).abs().mean() < 2
    with pytest.raises(ValueError, match="inputs"):
        inputs.make("uniform", 1, 8, 1, 8, device="cpu")


def test_table_has_a_row_per_input_distribution_and_names_gqa_heads():
    shape = dict(head_dim=128, causal=False, seqlen=8192, batch=2, nheads=32, nheads_k=8)
    rows = [dict(shape, inputs=kind, peer=peer, tflops=t) for kind, peer, t in
            (("random", "flashtile", 600.0), ("random", "cuDNN", 500.0), ("rising", "flashtile", 300.0),
             ("rising", "cuDNN", 500.0))]
    lines = table(rows, ["flashtile", "cuDNN"]).splitlines()[2:]
    assert lines == ["| 128 | no | 8192 | 2×32/8 | random | 600 | 500 | 1.20 |",
                     "| 128 | no | 8192 | 2×32/8 | rising | 300 | 500 | 0.60 |"]


def test_grid_adds_the_gqa_shape_and_each_distribution():
    from flashtile.bench.__main__ import grid
    shapes = list(grid([1024], [128], [True], ["random", "rising"], gqa=True))
    assert [(s["inputs"], s["seqlen"], s["nheads"], s["nheads_k"]) for s in shapes] == [
        ("random", 1024, 16, 16), ("random", 8192, 32, 8), ("rising", 1024, 16, 16), ("rising", 8192, 32, 8)]
    shapes = list(grid([1024], [64, 128], [False], gqa=True))  # the GQA shape once, not once per head dim
    assert [(s["head_dim"], s["nheads_k"]) for s in shapes] == [(64, 32), (128, 16), (128, 8)]


def test_small_calls_time_back_to_back_calls_in_turns():
    """flashtile.bench.small_calls: µs per call of many calls between two synchronizations; each peer's median over
    its turns, the turns rotating; a peer that raises keeps its error; the table gives flashtile's time over the
    fastest other peer's."""
    from flashtile.bench import small_calls
    syncs, order = [], []
    assert small_calls.per_call_us(lambda: None, 10, lambda: syncs.append(1)) >= 0 and len(syncs) == 2

    def timer(name):
        return lambda: order.append(name)

    def broken():
        raise RuntimeError("no kernel for this shape")
    us = small_calls.turns({"a": timer("a"), "b": timer("b"), "c": broken}, 3, 2, lambda: None)
    assert isinstance(us["a"], float) and isinstance(us["b"], float) and "RuntimeError" in us["c"]
    assert order == ["a"] * 2 + ["b"] * 2 + ["b"] * 2 + ["a"] * 2 + ["a"] * 2 + ["b"] * 2
    rows = [dict(batch=1, seqlen=1, nheads=32, head_dim=128, causal=False, mode="fwd",
                 us={"flashtile": 40.0, "FA2 (SDPA flash)": 50.0, "cuDNN": "OOM"})]
    line = small_calls.table(rows, ["flashtile", "FA2 (SDPA flash)", "cuDNN"]).splitlines()[-1]
    assert line == "| 1 | 1 | 32 | 128 | no | fwd | 40.0 | 50.0 | OOM | 0.80 |"


def test_host_time_is_what_issuing_the_calls_takes_between_two_syncs():
    """host_ms: one call and a sync first, then the clock stops before the closing sync (the host's time to issue a
    call, not the GPU's); host_bound names the steps whose host time reaches 90 % of their timed step."""
    import time

    from flashtile.bench.__main__ import host_bound, host_ms
    events = []

    def step():
        events.append("call")
        time.sleep(0.002)

    def sync():
        events.append("sync")
        time.sleep(0.05)  # a slow GPU: its time must not count
    ms = host_ms(step, sync, calls=5)
    assert events == ["call", "sync"] + ["call"] * 5 + ["sync"]
    assert 2.0 <= ms < 10.0
    shape = dict(head_dim=128, causal=True, seqlen=1024, batch=16, nheads=16)
    rows = [dict(shape, peer="flashtile", fwdbwd_ms=0.90, fwdbwd_host_ms=0.85),
            dict(shape, peer="FA4", fwdbwd_ms=0.70, fwdbwd_host_ms=0.40),
            dict(shape, peer="cuDNN", fwdbwd_ms=None, fwdbwd_host_ms=None)]
    assert host_bound(rows) == "- flashtile, D=128 causal N=1024: 0.850 ms of host time a step against 0.900 ms timed"


def test_a_window_counts_the_pairs_it_leaves_and_names_itself():
    """--window: the FLOPs of the (query, key) pairs a sliding window leaves, bottom-right aligned ((-1, 0) is
    causal's count, exactly: N(N+1)/2 pairs), the window named in the table; peers without windows say so."""
    from flashtile.bench.__main__ import fwd_flops, mask_name
    from flashtile.bench.peers import FORWARD
    assert fwd_flops(1, 1, 4, 4, 1, (-1, 0)) == 4 * 10 and fwd_flops(1, 1, 4, 4, 1, (-1, -1)) == 4 * 16
    assert fwd_flops(1, 1, 4, 4, 1, (1, 0)) == 4 * 7 and fwd_flops(1, 1, 2, 4, 1, (0, 0)) == 4 * 2
    assert fwd_flops(2, 3, 4, 6, 8, (1, 1)) == 2 * 3 * 8 * 4 * 11  # row i sees keys i+1 .. i+3 of 6
    assert mask_name((256, 0)) == "window (256, 0)" and mask_name(True) == "yes"
    shape = dict(head_dim=64, causal=(256, 0), seqlen=4096, batch=4, nheads=32)
    rows = [dict(shape, peer="flashtile", tflops=300.0), dict(shape, peer="cuDNN", tflops=None, error="no window")]
    assert table(rows, ["flashtile", "cuDNN"]).splitlines()[-1].startswith("| 64 | window (256, 0) | 4096 |")
    with pytest.raises(NotImplementedError, match="no sliding window"):
        FORWARD["cuDNN"]((256, 0))


def test_the_softcap_peers_cap_the_scores(monkeypatch):
    """"flashtile (softcap 50)" and its portable twin run flash_attn_func with Gemma 2's cap (the reference with it,
    on scores past the cap); "FA4 (softcap 50)" hands FA4 the same cap, plain "FA4" none."""
    import sys
    import types

    from helpers import DEVICE

    from flashtile import configs, reference
    from flashtile.bench.peers import FORWARD
    for name in ("BWD_BACKEND", "BWD_HOPPER"):  # (the peers leave them set for the backward that follows)
        monkeypatch.setattr(configs, name, getattr(configs, name))
    q = torch.randn(1, 16, 2, 32, dtype=torch.float16, device=DEVICE) * 8
    k, v = (torch.randn(1, 16, 2, 32, dtype=torch.float16, device=DEVICE) for _ in range(2))
    ref, _ = reference.attention(q, k, v, causal=True, softcap=50.0)
    for name in ("flashtile (softcap 50)", "flashtile (portable, softcap 50)"):
        prepare, run = FORWARD[name](True)
        assert (run(*prepare(q, k, v)).double() - ref).abs().max() < 1e-2, name
    calls = []
    fa4 = types.ModuleType("flash_attn.cute.interface")
    fa4.flash_attn_func = lambda q, k, v, **kwargs: calls.append(kwargs) or q
    for name, module in (("flash_attn", types.ModuleType("flash_attn")),
                         ("flash_attn.cute", types.ModuleType("flash_attn.cute")), ("flash_attn.cute.interface", fa4)):
        monkeypatch.setitem(sys.modules, name, module)
    for name in ("FA4 (softcap 50)", "FA4"):
        prepare, run = FORWARD[name](True)
        run(*prepare(q, k, v))
    assert calls[0]["softcap"] == 50.0 and "softcap" not in calls[1] and calls[1]["causal"]
