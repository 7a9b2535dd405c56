"""The kernels compile for sm90 (H100/H200) with every shipped tile config, on any machine:
ptxas ships with triton. They must use wgmma and TMA, fit in shared memory, and never spill; the Gluon
forward must reallocate registers and keep its wgmma asynchronous."""
import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

from flashtile import configs

SM90_SHARED_LIMIT = 232448  # bytes a block may use on sm90


def _compile_in_shards(*args, shards=2):
    """tools/compile_sm90.py's rows, its jobs split over ``shards`` processes at once (the compiles are single-
    threaded: the CPU tier's cores would wait)."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tools" / "compile_sm90.py"), *args, "--shard",
                               f"{k}/{shards}"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for k in range(shards)]
    rows = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        rows += json.loads(out)
    return rows


def test_forward_compiles_for_sm90():
    rows = _compile_in_shards()
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    hopper = {"flash_fwd_hopper_kernel"} if GLUON_VERSION_OK else set()
    assert {r["kernel"] for r in rows} == {"flash_fwd_kernel", "flash_bwd_kernel"} | hopper
    bwd_variants = sum(len({"none", c.dq_atomic}) for c in configs.BWD_SM90.values())
    hopper_fwd = sum(len(list(configs.hopper_fwd_chain(c))) for c in configs.FWD_HOPPER.values())
    assert len(rows) == 2 * len(configs.FWD_SM90) + 2 * bwd_variants + hopper_fwd * len(hopper)
    for row in rows:
        assert row["wgmma"] > 0 and row["tma_loads"] > 0, row
        assert (row["tma_reduce"] > 0) == (row["dq"] == "tma"), row
        # The Hopper kernel spills up to 124 bytes (ptxas -v: D=64 causal in three warpgroups 124 since _rebase,
        # D=128 causal 8 and 36, D=256 causal 24), each measured faster anyway (docs/perf/forward.md, v42); none of
        # it in a K/V loop (test_hopper_forward_spills_outside_the_key_loops). More is a regression.
        spill_limit = 124 if row["kernel"] == "flash_fwd_hopper_kernel" else 0
        assert row["local"] <= spill_limit, f"spills to local memory: {row}"
        assert row["shared"] <= SM90_SHARED_LIMIT, row
        assert row["clock_reads"] == 0, row  # Proton's records (pl.scope) compile to nothing unless they are on
        if row["kernel"] == "flash_fwd_hopper_kernel":  # warp-specialized, asynchronous wgmma kept asynchronous
            assert row["setmaxnreg"] > 0 and not row["serialized"], row
            assert not row["mbarrier_reuse"], row  # no scratch in a live barrier (docs/perf/forward.md v33)
            if row["head_dim"] == 128:  # O by a TMA store per consumer (configs o_tma), not in 4-byte pieces
                assert row["tma_stores"] == 2 and row["global_stores"]["v4"] == 0, row
                # P·V takes P from registers; with q_regs Q·Kᵀ takes Q from registers too
                assert row["wgmma_rs"] == (row["wgmma"] if row["q_regs"] else row["wgmma"] // 2), row


def test_the_recorded_forward_compiles_with_protons_records():
    """The forward `flashtile viz --pipeline --record` runs (D=128, not causal, 4k keys), with Proton's records of its
    phases compiled in (tools/compile_sm90.py --proton): the records are there, and it compiles as shipped: no
    spills, its wgmma asynchronous, its registers reallocated, in shared memory."""
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon forward needs triton 3.6")
    (row, ) = _compile_in_shards("--proton", shards=1)
    assert row["kernel"] == "flash_fwd_hopper_kernel" and row["clock_reads"] > 0, row
    assert row["local"] == 0 and not row["serialized"] and row["setmaxnreg"] > 0, row
    assert row["shared"] <= SM90_SHARED_LIMIT, row


def test_every_decode_launch_compiles_for_sm90():
    """Every decode launch the dispatch can pick (compile_sm90.decode_launches: each config of every table, contiguous
    and paged, by TMA and by pointers, 16 query rows up to its max_rows, every option on) compiles for sm90, fits its
    shared memory and never spills. flash-attn's kvcache tests once picked tiles that did neither: 384 query rows a
    head at D=64 (the compiler failed), 96 at D=256 with key groups (out of shared memory)."""
    rows = _compile_in_shards("--decode")
    from flashtile import dispatch
    assert len(rows) > 2 * (len(dispatch.decode_configs_sm90()) + len(dispatch.decode_paged_configs_sm90()))
    assert {r["tma"] for r in rows} == {True, False} and {r["paged"] for r in rows} == {True, False}
    for row in rows:
        assert row["local"] == 0 and row["shared"] <= SM90_SHARED_LIMIT, row
        assert row["tma_loads"] > 0 if row["tma"] else row["tma_loads"] == 0, row


def test_decode_rows_a_program_stay_within_the_config():
    """More query rows than a config's max_rows take more row tiles (one arrival counter each), never a larger tile."""
    from flashtile import dispatch
    from flashtile.kernels.portable.decode import arrival_slots, block_rows
    d64, d128 = configs.DECODE_SM90[64], configs.DECODE_SM90[128]
    assert block_rows(6, 64, d64) == 32 and arrival_slots(2, 1, 6, 64, d64) == 2 * 12  # 384 rows in 12 tiles
    assert block_rows(6, 64, d128) == 128 and block_rows(4, 1, d128) == 16 and block_rows(3, 5, d128) == 16
    grouped = dispatch.decode_config(256, False, False, configs.DECODE_GROUPED_FROM)
    assert grouped.key_groups == configs.DECODE_KEY_GROUPS and block_rows(6, 16, grouped) == 32


def _compiled_rows(rows_expr):
    """The rows that ``rows_expr`` (a list of tools/compile_sm90.py results; ``compile_sm90`` and
    ``configs`` are imported) evaluates to, in a process with the interpreter off."""
    code = ("import json, sys; sys.path.insert(0, 'tools'); import compile_sm90; from flashtile import configs; "
            f"print(json.dumps({rows_expr}))")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def _gluon_backward_rows(function, extra=""):
    """tools/compile_sm90.py's ``function`` for non-causal and causal (``extra``: more arguments)."""
    rows = _compiled_rows(f"[compile_sm90.{function}(c{extra}) for c in (False, True)]")
    for row in rows:
        assert row["setmaxnreg"] > 0 and not row["serialized"] and not row["mbarrier_reuse"], row
        assert row["tma_loads"] > 0 and row["shared"] <= SM90_SHARED_LIMIT, row
    return rows


def test_hopper_backward_compiles_for_sm90():
    """kernels/hopper/bwd.py: warp-specialized, wgmma asynchronous, within shared memory. At D=128 causal with GQA
    it spills a few loop-invariant scalars outside the loops (ptxas -v: 72 bytes; its branch that masks only the
    diagonal tiles costs registers, and measured 6-8 % faster anyway, docs/results/bwd-split-v2.md); otherwise none."""
    for row in _gluon_backward_rows("compile_hopper_bwd") + _gluon_backward_rows("compile_hopper_bwd", ", False, 64"):
        block_m = configs.BWD_HOPPER[(row["head_dim"], row["causal"])].block_m
        k_steps = 2 * (row["head_dim"] // 16) + 2 * block_m // 16  # Sᵀ, dPᵀ over the head dim; dV, dK over Q rows
        assert row["wgmma"] == 2 * k_steps, row  # two consumers
        assert row["local"] <= (72 if row["head_dim"] == 128 and row["causal"] else 0), row
        assert row["atomics"] == row["tma_reduce"] == 0, row
        assert row["global_stores"]["all"] == row["global_stores"]["v4"] > 0, row  # dK, dV in 16-byte runs of a row


def test_hopper_single_pass_backward_compiles_for_sm90():
    """kernels/hopper/bwd.py in one pass: each consumer adds dS K for its half of dQ's columns over both consumers'
    keys (two more products), handed to the copy engine as [D, 32] float32 boxes of 64 rows each, no atomics; wgmma
    asynchronous; batch mode and packed sequences. A step adds the previous step's dQ (the loop's code) and the last
    step's is added after the loop (the same code again). A few bytes of spills outside the loops at D=128, where the
    Q tile and dQ row a step counts on cost registers (docs/results/bwd-dq-rows-counted-run56.md); D=64's 128-row tiles
    spill a few bytes and measured faster anyway (docs/perf/backward.md, v9 and v12)."""
    for row in (_gluon_backward_rows("compile_hopper_bwd", ", True")
                + _gluon_backward_rows("compile_hopper_bwd", ", True, 64")
                + _gluon_backward_rows("compile_hopper_bwd", ", True, 128, True")
                + _gluon_backward_rows("compile_hopper_bwd", ", True, 64, True")):
        block_m = configs.BWD_HOPPER[(row["head_dim"], row["causal"])].block_m
        k_steps = 2 * (row["head_dim"] // 16) + 2 * block_m // 16  # as above
        k_steps += 2 * block_m // 64 * 2 * 4  # ... and dQ: 64-row products over each consumer's 64 keys, twice
        assert row["wgmma"] == 2 * k_steps, row
        limit = {(64, False): 40 if row["varlen"] else 24, (64, True): 208 if row["varlen"] else 188,
                 (128, False): 16, (128, True): 28 if row["varlen"] else 0}
        assert row["local"] <= limit.get((row["head_dim"], row["causal"]), 0), row
        assert row["tma_reduce"] == 2 * 2 * block_m // 64 and row["atomics"] == 0, row
        assert row["global_stores"]["all"] == row["global_stores"]["v4"] > 0, row  # dK, dV in 16-byte runs of a row


@pytest.mark.parametrize("delta_in", [False, True], ids=["delta-here", "delta-in"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
def test_hopper_dq_compiles_for_sm90(head_dim, delta_in):
    """kernels/hopper/bwd_dq.py with each head dim's shipped tiles, computing delta or reading it: warp-specialized,
    wgmma asynchronous, no spills, within shared memory, dQ stored in 16-byte runs."""
    rows = _gluon_backward_rows("compile_hopper_dq", f", None, {head_dim}, {delta_in}")
    for row, causal in zip(rows, (False, True)):
        block_n = configs.BWD_HOPPER[(head_dim, causal)].dq_hopper.block_n
        assert row["wgmma"] == 2 * (2 * head_dim // 16 + block_n // 16) and row["local"] == 0, row  # S, dP; dQ
        assert row["global_stores"]["v4"] == 2 * head_dim // 16, row  # dQ in 16-byte runs of a row, two consumers


@pytest.mark.parametrize("nheads_k", [1, 2, 8], ids=lambda h: f"hk{h}")
def test_hopper_split_backward_compiles_for_sm90(nheads_k):
    """kernels/hopper/bwd_split.py (D=256): one warpgroup per gradient, each two products a step (Sᵀ and dV, dPᵀ and
    dK), no spills, within shared memory; GQA groups of 8, 4 and 1 (a group or head count of 1 arrives as a
    constant, which once failed to compile on the GPU)."""
    for row in _gluon_backward_rows("compile_hopper_split", f", {nheads_k}"):
        assert row["wgmma"] == 2 * (256 // 16) + 2 * (64 // 16) and row["local"] == 0, row
        assert row["wgmma_rs"] == 2 * (64 // 16) and row["atomics"] == 0, row  # Pᵀ and dSᵀ from registers
        assert row["global_stores"]["all"] == row["global_stores"]["v4"] > 0, row  # dK, dV in 16-byte runs of a row


@pytest.mark.parametrize("head_dim, tile", [(96, 128), (192, 256)])
def test_a_padded_head_dim_compiles_as_its_tiles(head_dim, tile):
    """D=96 and D=192 run the kernels of D=128 and D=256 (every forward config of the chain, the backward's dK/dV
    kernel in its shipped design, the dQ kernel): the same products, shared memory and TMA copies, these through 3-D
    views (common.tile_descriptor), and no more spills than the tiles' own head dim."""
    fwd = "[compile_sm90.compile_hopper_fwd({d}, c, cfg) for c in (False, True) for cfg in " \
          "configs.hopper_fwd_chain(configs.FWD_HOPPER[({t}, c)])]"
    dkdv = "compile_hopper_split" if configs.BWD_HOPPER[(tile, False)].split_gradients else "compile_hopper_bwd"
    extra = "" if dkdv == "compile_hopper_split" else "True, "
    bwd = f"[compile_sm90.{dkdv}(c, {extra}head_dim={{d}}) for c in (False, True)]"
    dq = "[compile_sm90.compile_hopper_dq(c, head_dim={d}) for c in (False, True)]"
    for expr in (fwd, bwd, dq):
        padded, own = (_compiled_rows(expr.format(d=d, t=tile)) for d in (head_dim, tile))
        assert len(padded) == len(own) > 0
        for got, want in zip(padded, own):
            same = ("wgmma", "wgmma_rs", "shared", "tma_loads", "tma_stores", "tma_reduce", "setmaxnreg")
            assert {k: got[k] for k in same} == {k: want[k] for k in same}, (got, want)
            assert got["tma_3d"] > 0 and want["tma_3d"] == 0, (got, want)
            assert got["local"] <= want["local"], (got, want)
            assert not got["serialized"] and not got["mbarrier_reuse"], got


def test_hopper_backward_compiles_with_a_window():
    """A sliding window (left, right) in each sm90 backward kernel (one pass and two kernels at D=128, the one pass on
    packed sequences, the dQ kernel, D=256's split kernel): the same products and shared memory as without it, wgmma
    asynchronous; the two-kernel dK/dV kernel spills a few loop-invariant scalars, as causal does
    (test_hopper_backward_compiles_for_sm90)."""
    calls = ["compile_hopper_bwd(False, True, 128, window={w})", "compile_hopper_bwd(False, False, 128, window={w})",
             "compile_hopper_bwd(False, True, 128, True, window={w})", "compile_hopper_dq(False, window={w})",
             "compile_hopper_split(False, window={w})"]
    listed = ", ".join("compile_sm90." + c.format(w=w) for c in calls for w in ((256, 0), None))
    rows = _compiled_rows(f"[{listed}]")
    for windowed, plain in zip(rows[::2], rows[1::2]):
        assert windowed["window"] == [256, 0] and plain["window"] is None
        assert (windowed["wgmma"], windowed["shared"]) == (plain["wgmma"], plain["shared"]), (windowed, plain)
        assert not windowed["serialized"] and not windowed["mbarrier_reuse"] and windowed["local"] <= 80, windowed


def test_hopper_forward_compiles_with_a_window():
    """A sliding window (both sides, open to the right, and on packed sequences) on each head dim's non-causal forward:
    the same products as without it, within shared memory, wgmma asynchronous; D=64's three consumer warpgroups spill a
    few scalars, as their causal mask does (test_hopper_forward_192_rows_compiles_for_sm90)."""
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernel is written against triton 3.6")
    rows = _compiled_rows("[compile_sm90.compile_hopper_fwd(d, False, configs.FWD_HOPPER[(d, False)], 2048, w, p) "
                          "for d in (64, 128, 256) for w, p in ((None, False), ((256, 0), False), ((100, -1), False), "
                          "((256, 0), True))]")
    for plain, *windowed in zip(rows[::4], rows[1::4], rows[2::4], rows[3::4]):
        assert plain["window"] is None and [row["window"] for row in windowed] == [[256, 0], [100, -1], [256, 0]]
        assert [row["varlen"] for row in windowed] == [False, False, True]
        for row in windowed:
            assert row["wgmma"] == plain["wgmma"] and row["shared"] <= SM90_SHARED_LIMIT, (row, plain)
            assert not row["serialized"] and row["local"] <= (64 if row["head_dim"] == 64 else 28), row


def test_hopper_forward_compiles_with_a_softcap():
    """flash-attn's softcap (tanh of the scores) in the forward of every head dim's configs that take a cap (D=64's
    take none, configs.FWD_HOPPER), causal or not, batch mode (a window too at D=256): the same products as without
    it, within shared memory, wgmma asynchronous; spills no more than 16 bytes more than without it."""
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernel is written against triton 3.6")
    assert not configs.FWD_HOPPER[(64, False)].softcap and not configs.FWD_HOPPER[(64, True)].softcap
    rows = _compiled_rows("[compile_sm90.compile_hopper_fwd(d, c, configs.FWD_HOPPER[(d, c)], 2048, w, False, s) "
                          "for d, c, w in ((128, False, None), (128, True, None), (256, False, None), "
                          "(256, True, None), (256, False, (4096, 0))) for s in (0.0, 50.0)]")
    for plain, capped in zip(rows[::2], rows[1::2]):
        assert plain["softcap"] == 0.0 and capped["softcap"] == 50.0
        assert capped["wgmma"] == plain["wgmma"] and capped["shared"] <= SM90_SHARED_LIMIT, (capped, plain)
        assert not capped["serialized"] and capped["local"] <= max(plain["local"] + 16, 28), (capped, plain)


def test_hopper_split_design_compiles_on_packed_sequences():
    """The split design's two kernels on packed sequences (D=256, causal or not, the dQ kernel computing or reading
    delta), plain and with a window and a cap: the same products and shared memory as in batch mode, wgmma
    asynchronous, at most 48 bytes of spills (the split kernel with a window and a cap)."""
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernel is written against triton 3.6")
    calls = ["compile_hopper_split({c}, 2, 256, {w}, {s}, {p})", "compile_hopper_dq({c}, head_dim=256, window={w}, "
             "softcap={s}, packed={p})", "compile_hopper_dq({c}, head_dim=256, delta_in=True, window={w}, softcap={s}, "
             "packed={p})"]
    listed = ", ".join("compile_sm90." + call.format(c=c, w=w, s=s, p=p) for call in calls for c in (False, True)
                       for w, s in ((None, 0.0), ((4096, 0), 50.0)) for p in (False, True))
    rows = _compiled_rows(f"[{listed}]")
    for batch, packed in zip(rows[::2], rows[1::2]):
        assert not batch["varlen"] and packed["varlen"]
        assert (packed["wgmma"], packed["shared"]) == (batch["wgmma"], batch["shared"]), (packed, batch)
        assert not packed["serialized"] and packed["local"] <= 48, packed


def test_hopper_backward_compiles_with_a_softcap():
    """flash-attn's softcap in the split design's two kernels (the dQ kernel computing or reading delta, the dK/dV
    kernel of one warpgroup per gradient), D=256 and D=192 in its tiles, causal or not: the same products and shared
    memory as without it, wgmma asynchronous, no more spills."""
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernel is written against triton 3.6")
    calls = ["compile_hopper_dq({c}, head_dim={d}, softcap={s})", "compile_hopper_dq({c}, head_dim={d}, delta_in=True, "
             "softcap={s})", "compile_hopper_split({c}, 2, {d}, softcap={s})"]
    listed = ", ".join("compile_sm90." + call.format(c=c, d=d, s=s) for call in calls for c in (False, True)
                       for d in (256, 192) for s in (0.0, 50.0))
    rows = _compiled_rows(f"[{listed}]")
    for plain, capped in zip(rows[::2], rows[1::2]):
        assert plain["softcap"] == 0.0 and capped["softcap"] == 50.0
        assert (capped["wgmma"], capped["shared"]) == (plain["wgmma"], plain["shared"]), (capped, plain)
        assert not capped["serialized"] and capped["local"] <= plain["local"], (capped, plain)


def test_hopper_forward_192_rows_compiles_for_sm90():
    """The forward with three consumer warpgroups (192-row tiles), causal too (its warpgroups stop at their
    own last rows, a code path the shipped configs compile only for D=64 non-causal): 16 warps whose consumers
    get 160 registers, wgmma asynchronous, within shared memory (with the scratch of O's conversion to 16-byte
    row runs); causal spills 68 bytes (ptxas -v), a path the shipped configs leave to the portable kernel."""
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernel is written against triton 3.6")
    for row in _compiled_rows("[compile_sm90.compile_hopper_fwd(64, c, configs.HopperFwdConfig(block_m=192, block_n=128, "  # noqa: E501
                              "num_stages=3, consumer_regs=160, maxnreg=128, persistent=True)) for c in (False, True)]"):  # noqa: E501
        assert row["setmaxnreg"] > 0 and not row["serialized"], row
        assert row["wgmma"] == 72 and row["shared"] <= SM90_SHARED_LIMIT, row  # 3 consumers x (4 + 4 + 8 + 8) k-steps
        assert row["local"] <= (68 if row["causal"] else 0), row
        assert row["global_stores"]["v4"] == 12, row  # O in 16-byte runs: 3 consumers x 4 runs of a 64-wide row


def test_hopper_forward_compiles_for_one_query_row():
    """Nq = 1 reaches the compiler as a constant (triton specializes 1), which folds more of the schedule
    (kernels/hopper/fwd_schedule.work_item): every shipped non-causal config still compiles, wgmma asynchronous."""
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernel is written against triton 3.6")
    rows = _compiled_rows("[compile_sm90.compile_hopper_fwd(d, False, c, seqlen=1) for d in (64, 128) "
                          "for c in configs.hopper_fwd_chain(configs.FWD_HOPPER[(d, False)])]")
    assert len(rows) == 3
    for row in rows:
        assert row["setmaxnreg"] > 0 and not row["serialized"] and row["wgmma"] > 0, row


def test_mbarrier_reuse_reports_scratch_over_an_initialized_barrier():
    """tools/compile_sm90.py's mbarrier_reuse on PTX shaped like the D=64 forward's before v33: the O conversion's
    scratch (two warpgroups, 2 KB apart) starting on an initialized barrier is reported, barriers past it are not, nor
    barriers released by mbarrier.inval first (as triton's own pipelined loops do)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from compile_sm90 import mbarrier_reuse
    init = "add.s32 %r{0}, %r9, {1};\n@%p1 mbarrier.init.shared::cta.b64 [%r{0}], 1;\n"
    ptx = init.format(1, 4096) + init.format(2, 4104) + init.format(3, 8192)
    scratch = "st.shared.v4.b32 [%r5+0], {%r6, %r7, %r8, %r9};\nst.shared.v4.b32 [%r5+2048], {%r6, %r7, %r8, %r9};\n"
    assert mbarrier_reuse(ptx + scratch.replace("+0]", "+4096]").replace("+2048]", "+6144]")) == [4096, 4104]
    assert mbarrier_reuse(ptx + scratch) == []  # scratch at 0 and 2048, barriers from 4096
    released = ptx + "@%p1 mbarrier.inval.shared::cta.b64 [%r1];\n@%p1 mbarrier.inval.shared::cta.b64 [%r2];\n"
    assert mbarrier_reuse(released + scratch.replace("+0]", "+4096]").replace("+2048]", "+6144]")) == []
    assert mbarrier_reuse(ptx + "ld.shared.v4.b32 {%r4, %r5, %r6, %r7}, [%r3+8176];\n") == []  # 16 bytes below it
    # rows of 32 bytes right after an allocation 4 KB before them: the rows' base covers 32 bytes, not 4 KB
    rows = "".join(f"ld.shared.v2.b32 {{%r4, %r5}}, [%r3+{c}];\n" for c in (0, 4096, 4128, 4160))
    near = init.format(1, 4200) + init.format(2, 4208) + init.format(3, 8192)
    assert mbarrier_reuse(near + rows) == []



def test_hopper_forward_spills_outside_the_key_loops():
    """The configs that spill (D=64 causal in three warpgroups, D=128 causal) keep every K/V loop free of local memory:
    the spilled values are reloaded once per work item (tools/sass_mix.key_loops on the disassembly)."""
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernel is written against triton 3.6")
    loops = _compiled_rows("[(d, c.block_m, [list(x) for x in __import__('sass_mix').key_loops("
                           "__import__('sass_mix').sass_of(d, True, c))]) for d in (64, 128) "
                           "for c in configs.hopper_fwd_chain(configs.FWD_HOPPER[(d, True)])]")
    assert len(loops) == 4
    for head_dim, block_m, found in loops:
        assert len(found) == block_m // 64, (head_dim, block_m, found)  # one per consumer warpgroup
        assert all(spills == 0 for _, _, spills in found), (head_dim, block_m, found)


def test_hopper_backward_consumer_loops_keep_to_registers():
    """The one-pass backward at D=128, both masks: each consumer warpgroup's step is one innermost loop with its
    32 matrix-product instructions and 32 exponentials a thread (64 keys x 64 rows / 128 threads), and at most one
    local-memory access a step (tools/sass_mix.inner_loops on the disassembly; one warpgroup's non-causal loop has one
    since v15, which measured faster: docs/results/bwd-v15-run57.md)."""
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernel is written against triton 3.6")
    loops = _compiled_rows("[[(len(b), sum('MUFU.EX2' in t for t in b), sum('HGMMA' in t for t in b), "
                           "sum('LDL' in t or 'STL' in t for t in b)) for _, b in __import__('sass_mix').inner_loops("
                           "__import__('sass_mix').sass_of(128, c, None, 'bwd'))] for c in (False, True)]")
    for found in loops:
        steps = [loop for loop in found if loop[2] == 32 and loop[1] == 32]
        assert len(steps) == 2 and all(local <= 1 for *_, local in steps), found


def test_hopper_decode_compiles_for_sm90():
    """kernels/hopper/decode.py, both configs on both cache layouts: warp-specialized (registers moved to the consumer
    warps), no
    spills, within shared memory, two TMA loads (K, V) and each consumer's mma.sync: 4 warps x (2 · 8 for Q·Kᵀ of 16
    keys + 16 for P·V) a tile."""
    from flashtile.kernels.hopper.common import GLUON_VERSION_OK
    if not GLUON_VERSION_OK:
        pytest.skip("the Gluon kernel is written against triton 3.6")
    for row in _compiled_rows("[compile_sm90.compile_hopper_decode(l, c) for l in ('key', 'head') "
                              "for c in (configs.DECODE_HOPPER[128], configs.DECODE_HOPPER_LONG[128])]"):
        assert row["setmaxnreg"] > 0 and row["local"] == 0 and not row["mbarrier_reuse"], row
        assert row["tma_loads"] == 2 and row["shared"] <= SM90_SHARED_LIMIT, row
        assert row["mma_sync"] == 4 * (2 * 8 + 16), row
