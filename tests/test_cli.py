"""The command line: mistakes get argparse's error (exit 2), GPU-only commands one line without a GPU."""
import pytest
import torch

from flashtile import __version__, cli
from flashtile.kernels.common.tiles import head_dim_pad


@pytest.mark.parametrize("argv", [["demo", "--seqln", "512"], ["demo", "--seqlen", "0"], ["viz", "--seqlen", "0"],
                                  ["viz", "--block-n", "x"], ["viz", "--algo", "fa3"], ["nonsense"]],
                         ids=["typo", "demo-zero", "viz-zero", "viz-not-int", "viz-algo", "command"])
def test_mistakes_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_viz_into_a_missing_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["viz", "-o", str(tmp_path / "missing" / "x.html")])
    assert exit_info.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_viz_writes_a_page(tmp_path):
    out = tmp_path / "fa2.html"
    assert cli.main(["viz", "--algo", "fa2", "--seqlen", "4", "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"flashtile {__version__}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU prints")
@pytest.mark.parametrize("run", ["bench", "tune", "lessons", "decode", "small_calls"])
def test_gpu_commands_say_so_in_one_line_without_a_gpu(run):
    from flashtile.bench import __main__ as bench
    from flashtile.bench import decode, lessons, small_calls, tune
    main = {"bench": lambda: cli.main(["bench", "--seqlens", "1024"]), "tune": lambda: cli.main(["tune"]),
            "lessons": lambda: lessons.main([]), "decode": lambda: decode.main([]),
            "small_calls": lambda: small_calls.main([])}[run]
    with pytest.raises(SystemExit) as exit_info:
        main()
    message = str(exit_info.value.code)
    assert "needs a CUDA GPU" in message and "\n" not in message
    assert bench.require_gpu is tune.require_gpu  # one helper says it everywhere


def test_viz_asks_before_writing_a_large_page(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "PAGE_LIMIT_MB", 0.001)
    out = tmp_path / "big.html"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["viz", "--seqlen", "16", "-o", str(out)])
    assert exit_info.value.code == 2 and "--force" in capsys.readouterr().err and not out.exists()
    assert cli.main(["viz", "--seqlen", "16", "--force", "-o", str(out)]) == 0 and out.exists()


def test_info_names_the_files_that_run_each_sm90_backward():
    """`flashtile info`'s backward lines: one per configs.BWD_HOPPER entry, naming kernel files
    that exist, in launch order, and what deterministic=True runs instead where it differs."""
    import re
    from pathlib import Path

    from flashtile import configs
    lines = cli.backward_plans()
    assert len(lines) == len(configs.BWD_HOPPER)
    kernels = Path(cli.__file__).parent / "kernels"
    for line in lines:
        names = re.findall(r"(\w+/\w+\.py)", line)
        assert names and all((kernels / name).is_file() for name in names), line
    assert any("hopper/bwd_split.py" in line and line.startswith("D=256") for line in lines)
    assert any("deterministic=True: hopper/bwd_dq.py" in line for line in lines)  # the one pass's exact fallback


def test_info_prints_the_plans_of_a_call(capsys):
    """`flashtile info --head-dim 64 --causal`: which kernel file and config serve that call on this machine, as
    dispatch plans them."""
    assert cli.main(["info", "--seqlen", "512", "--heads", "8", "--kv-heads", "2", "--head-dim", "64", "--causal"]) == 0
    out = capsys.readouterr().out
    forward, backward = cli.call_plans(1, 512, 8, 2, 64, True)
    assert "heads 8/2, head dim 64, causal" in out
    assert f"  forward: {forward}\n" in out and f"  backward: {backward}\n" in out
    assert f"{cli.decode_plan(1, 4096, 8, 2, 64)}\n" in out and "kernels/" in str(cli.decode_plan(1, 4096, 8, 2, 64))
    assert str(forward).startswith("kernels/") and " with " in str(backward)
    with pytest.raises(SystemExit):
        cli.main(["info", "--heads", "8", "--kv-heads", "3"])


@pytest.mark.parametrize("shape, kernel", [(["--causal"], "hopper"),
                                           (["--head-dim", "256", "--seqlen", "1024"], "hopper"),
                                           (["--head-dim", "96"], "hopper"), (["--head-dim", "36"], "hopper"),
                                           (["--head-dim", "24"], "portable")],
                         ids=["d128-causal", "d256", "d96", "d36-padded-to-40", "d24"])
def test_info_says_what_an_sm90_gpu_runs_and_with_which_switches(shape, kernel, capsys):
    """On any machine ``info`` names the sm90 forward's kernel for the call; for the Hopper kernel, the config its
    chain picks for the call's rows and the compile-time switches its launch derives (bf16: FROZEN_MAX)."""
    from flashtile import configs
    assert cli.main(["info", *shape]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("on an sm90 GPU"))
    assert f"kernels/{kernel}/fwd.py" in line
    if kernel == "hopper":
        causal, head_dim = "--causal" in shape, int(shape[1]) if shape[0] == "--head-dim" else 128
        seqlen = int(shape[3]) if len(shape) > 2 else 4096
        chain = configs.hopper_fwd_chain(configs.FWD_HOPPER[(head_dim_pad(head_dim), causal)])
        picked = next(c for c in chain if seqlen >= c.min_seqlen_q)
        assert f"block_m={picked.block_m}, block_n={picked.block_n}" in line and "below=" not in line
        assert f"FwdSwitches(MASK_RIGHT={causal}, MASK_LEFT=False," in line
        assert f"FROZEN_MAX={picked.frozen_max}" in line



def test_info_says_a_window_runs_the_sm90_kernels(capsys):
    """--window: on sm90 a sliding window runs the sm90 forward with both sides of the band masked (the non-causal
    config, FROZEN_MAX in bf16 at D=128) and the sm90 backward's one pass; a window narrower than the config's
    min_window the portable forward."""
    assert cli.main(["info", "--window", "1000", "0"]) == 0
    out = capsys.readouterr().out
    assert "head dim 128, window (1000, 0))" in out
    line = next(line for line in out.splitlines() if line.startswith("on an sm90 GPU"))
    assert "kernels/hopper/fwd.py" in line and "FwdSwitches(MASK_RIGHT=True, MASK_LEFT=True," in line
    assert "FROZEN_MAX=True" in line
    assert "the backward runs, in kernels/, portable/bwd.py (delta, zeroed dQ) -> hopper/bwd.py" in out
    assert cli.main(["info", "--window", "256", "0"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("on an sm90 GPU")]
    assert lines[0].endswith("the forward runs kernels/portable/fwd.py") and "hopper/bwd.py" in lines[1]


def test_info_says_a_padded_head_dim_runs_in_wider_tiles(capsys):
    """A head dim between powers of two runs on sm90 in the next one's tiles, and ``info`` says so; a power of two
    takes no such line."""
    assert cli.main(["info", "--head-dim", "80"]) == 0
    assert "take head dim 80 in tiles of 128 columns" in capsys.readouterr().out
    assert cli.main(["info", "--head-dim", "64"]) == 0
    assert "take head dim" not in capsys.readouterr().out


@pytest.mark.parametrize("shape, files", [(["--causal"], "hopper/bwd.py"),
                                          (["--head-dim", "256", "--deterministic"], "hopper/bwd_split.py"),
                                          (["--head-dim", "192"], "hopper/bwd_split.py"), (["--head-dim", "24"], None)],
                         ids=["d128-causal", "d256-deterministic", "d192", "d24"])
def test_info_says_which_sm90_backward_runs(shape, files, capsys):
    """On any machine ``info`` names the sm90 backward's kernel files for the call, in launch order, with the
    configs.BWD_HOPPER entry and the design that entry takes (deterministic=True: no atomics)."""
    from flashtile import configs
    assert cli.main(["info", *shape]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("on an sm90 GPU") and "backward" in line)
    if files is None:
        assert line.endswith("the backward runs kernels/portable/bwd.py")
        return
    head_dim = int(shape[1]) if shape[0] == "--head-dim" else 128
    config = configs.BWD_HOPPER[(head_dim_pad(head_dim), "--causal" in shape)]
    assert files in line and line.endswith(f"with {config}")
    assert cli.BACKWARD_FILES[config.design("--deterministic" in shape)] in line


def test_info_follows_the_backends(monkeypatch, capsys):
    """FLASHTILE_FWD_BACKEND / FLASHTILE_BWD_BACKEND=portable (configs.FWD_BACKEND, BWD_BACKEND): ``info`` says an
    sm90 GPU runs the portable kernels too (dispatch's picks read the backends, as the calls do)."""
    from flashtile import configs
    monkeypatch.setattr(configs, "FWD_BACKEND", "portable")
    monkeypatch.setattr(configs, "BWD_BACKEND", "portable")
    assert cli.main(["info", "--causal"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("on an sm90 GPU")]
    assert lines == ["on an sm90 GPU (H100, H200) in bf16 the forward runs kernels/portable/fwd.py",
                     "on an sm90 GPU (H100, H200) in bf16 the backward runs kernels/portable/bwd.py"]


def test_info_says_where_a_softcap_runs(capsys):
    """--softcap: on sm90 the forward caps its scores in the Hopper kernel (the tanh's scale among its switches); the
    backward takes the split design's kernels at D=256 and the one pass at D=128 (configs.BWD_HOPPER_SOFTCAP)."""
    assert cli.main(["info", "--head-dim", "256", "--window", "4096", "0", "--softcap", "50"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("on an sm90 GPU")]
    assert "kernels/hopper/fwd.py" in lines[0] and f"SOFTCAP_SCALE={256 ** -0.5 / 50}" in lines[0]
    assert "hopper/bwd_split.py" in lines[1]
    assert cli.main(["info", "--softcap", "50"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("on an sm90 GPU")]
    assert "kernels/hopper/fwd.py" in lines[0] and "hopper/bwd.py (dK, dV; dQ by the copy engine" in lines[1]
