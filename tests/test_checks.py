"""Bad input is refused with a clear error naming the argument, before any kernel launch."""
import pytest
import torch
from helpers import DEVICE, randn, value_checks

import flashtile
from flashtile import checks
from flashtile.kernels.portable import fwd


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    """Any launch during these tests is a failure: the checks must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was launched before the input was refused")
    monkeypatch.setattr(fwd.flash_fwd_kernel, "run", refuse)


def qkv(batch=2, seqlen_q=16, seqlen_k=16, nheads=4, nheads_k=4, head_dim=64, dtype=torch.float16):
    return (randn(batch, seqlen_q, nheads, head_dim, dtype=dtype),
            randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype),
            randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype))


def call(q, k, v, **kw):
    return flashtile.flash_attn_func(q, k, v, **kw)


BAD_BATCHED = {
    "q-not-tensor": (lambda q, k, v: call(q.tolist(), k, v), TypeError, "q must be a torch.Tensor"),
    "int-dtype": (lambda q, k, v: call(q.to(torch.int32), k, v), TypeError, "q has dtype torch.int32"),
    "fp64": (lambda q, k, v: call(q.double(), k.double(), v.double()), TypeError, "float64"),
    "dtype-mismatch": (lambda q, k, v: call(q, k.float(), v), TypeError, "k has dtype torch.float32"),
    "rank": (lambda q, k, v: call(q[0], k, v), ValueError, "q must have rank 4"),
    "batch": (lambda q, k, v: call(q, k[:1], v[:1]), ValueError, "batch sizes differ"),
    "kv-seqlen": (lambda q, k, v: call(q, k, v[:, :5]), ValueError, "k and v must agree"),
    "head-dim-mismatch": (lambda q, k, v: call(q, k[..., :32], v[..., :32]), ValueError, "head dims differ"),
    "head-dim-too-big": (lambda q, k, v: call(*(torch.cat([t] * 5, -1) for t in (q, k, v))), ValueError,
                         "head dim 320"),
    "window-float-tensor": (lambda q, k, v: call(q, k, v, window_size=torch.tensor([2.0, 1.0])), TypeError,
                            "window_size left must be an int"),
    "window-tensor-shape": (lambda q, k, v: call(q, k, v, window_size=torch.tensor([2, 1, 0])), TypeError,
                            "window_size must be a pair"),
    "heads-not-multiple": (lambda q, k, v: call(q, k[:, :, :3], v[:, :, :3]), ValueError, "not a multiple"),
    "dropout": (lambda q, k, v: call(q, k, v, dropout_p=0.1), NotImplementedError, "dropout_p"),
    "softcap-negative": (lambda q, k, v: call(q, k, v, softcap=-30.0), ValueError, "softcap must be"),
    "alibi-shape": (lambda q, k, v: call(q, k, v, alibi_slopes=torch.ones(3, device=q.device)), ValueError,
                    "alibi_slopes must be"),
    "alibi-dtype": (lambda q, k, v: call(q, k, v, alibi_slopes=torch.ones(4, device=q.device).half()), TypeError,
                    "alibi_slopes must be float32"),
    "scale-negative": (lambda q, k, v: call(q, k, v, softmax_scale=-1.0), ValueError, "softmax_scale"),
    "scale-type": (lambda q, k, v: call(q, k, v, softmax_scale="0.1"), TypeError, "softmax_scale"),
    "window-shape": (lambda q, k, v: call(q, k, v, window_size=3), TypeError, "window_size"),
    "window-value": (lambda q, k, v: call(q, k, v, window_size=(-2, 0)), ValueError, "window_size left"),
    "causal-type": (lambda q, k, v: call(q, k, v, causal="yes"), TypeError, "causal"),
}


@pytest.mark.parametrize("case", list(BAD_BATCHED))
def test_bad_batched_input(case):
    fn, error, message = BAD_BATCHED[case]
    with pytest.raises(error, match=message):
        fn(*qkv())


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a second device: a CUDA GPU beside the CPU")
def test_device_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k is on cpu"):
        call(q, k.cpu(), v)


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU-tensor refusal is seen only off the interpreter")
def test_cpu_tensor_without_interpreter(monkeypatch):
    monkeypatch.setattr(checks, "_interpreter", False)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        call(*qkv())


def varlen(seqlens=(3, 0, 7), nheads=2, head_dim=32):
    total = sum(seqlens)
    cu = torch.tensor([0, *seqlens], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)
    q, k, v = (randn(total, nheads, head_dim, dtype=torch.float16) for _ in range(3))
    return q, k, v, cu, max(seqlens)


def call_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
    return flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


def _cu(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


BAD_VARLEN = {
    "cu-int64": (lambda q, k, v, cu, m: call_varlen(q, k, v, cu.long(), cu, m, m), TypeError,
                 "cu_seqlens_q must be int32"),
    "cu-not-zero": (lambda q, k, v, cu, m: call_varlen(q, k, v, cu, cu + 1, m, m), ValueError,
                    "cu_seqlens_k must start at 0"),
    "cu-decreasing": (lambda q, k, v, cu, m: call_varlen(q, k, v, _cu([0, 5, 3, 10]), cu, m, m), ValueError,
                      "non-decreasing"),
    "cu-beyond": (lambda q, k, v, cu, m: call_varlen(q, k, v, _cu([0, 3, 3, 11]), cu, 8, m), ValueError,
                  "beyond the 10 packed tokens"),
    "cu-2d": (lambda q, k, v, cu, m: call_varlen(q, k, v, cu[None], cu, m, m), ValueError, "1-D"),
    "cu-count": (lambda q, k, v, cu, m: call_varlen(q, k, v, cu[:-1], cu, m, m), ValueError,
                 "both must be batch"),
    "max-too-small": (lambda q, k, v, cu, m: call_varlen(q, k, v, cu, cu, m - 1, m), ValueError,
                      "max_seqlen_q=6"),
    "max-type": (lambda q, k, v, cu, m: call_varlen(q, k, v, cu, cu, m, 7.0), TypeError, "max_seqlen_k"),
    "max-float-tensor": (lambda q, k, v, cu, m: call_varlen(q, k, v, cu, cu, torch.tensor(7.0), m), TypeError,
                         "max_seqlen_q must be an int or a 0-d integer tensor"),
    "max-negative": (lambda q, k, v, cu, m: call_varlen(q, k, v, cu, cu, -1, m), ValueError, "max_seqlen_q must be"),
    "rank": (lambda q, k, v, cu, m: call_varlen(q[None], k, v, cu, cu, m, m), ValueError, "rank 3"),
    "dropout": (lambda q, k, v, cu, m: call_varlen(q, k, v, cu, cu, m, m, dropout_p=0.5), NotImplementedError,
                "dropout_p"),
}


@pytest.mark.parametrize("case", list(BAD_VARLEN))
def test_bad_varlen_input(case):
    fn, error, message = BAD_VARLEN[case]
    q, k, v, cu, max_seqlen = varlen()
    with value_checks(), pytest.raises(error, match=message):
        fn(q, k, v, cu, max_seqlen)


def sdpa_inputs():
    return (randn(2, 4, 16, 64, dtype=torch.float16), randn(2, 2, 16, 64, dtype=torch.float16),
            randn(2, 2, 16, 64, dtype=torch.float16))


def test_sdpa_gqa_needs_enable_gqa():
    with pytest.raises(ValueError, match="enable_gqa"):
        flashtile.scaled_dot_product_attention(*sdpa_inputs())


def test_sdpa_attn_mask_not_implemented():
    """The message says what to use instead, and describes the mask rather than printing it."""
    q, k, v = sdpa_inputs()
    with pytest.raises(NotImplementedError, match="attn_mask is not supported by flashtile yet") as error:
        flashtile.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(16, 16, dtype=torch.bool),
                                               enable_gqa=True)
    message = str(error.value)
    assert "shape (16, 16)" in message and "is_causal=True" in message and "True, True" not in message


def test_sdpa_rank():
    q, k, v = sdpa_inputs()
    with pytest.raises(ValueError, match="query must be a 4-D"):
        flashtile.scaled_dot_product_attention(q[0], k, v)


def test_value_checks_can_be_turned_off(monkeypatch):
    """With set_value_checks(False) the host never reads cu_seqlens: a too-small max_seqlen goes unnoticed. By default
    the check runs where cu_seqlens lives on the host (the CPU tier) and not on the GPU (no sync); the debug mode
    runs it everywhere."""
    from flashtile.kernels.portable import packed
    q, k, v, cu, max_seqlen = varlen()
    monkeypatch.setattr(fwd.flash_fwd_kernel, "run", lambda *args, **kwargs: None)
    monkeypatch.setattr(packed.safe_offsets_kernel, "run", lambda *args, **kwargs: None)
    monkeypatch.setattr(packed.zero_unused_rows_kernel, "run", lambda *args, **kwargs: None)
    flashtile.set_value_checks(False)
    try:
        call_varlen(q, k, v, cu, cu, max_seqlen - 1, max_seqlen)
    finally:
        flashtile.set_value_checks(None)
    if cu.is_cuda:
        call_varlen(q, k, v, cu, cu, max_seqlen - 1, max_seqlen)
    else:
        with pytest.raises(ValueError, match="max_seqlen_q"):
            call_varlen(q, k, v, cu, cu, max_seqlen - 1, max_seqlen)
    with value_checks(), pytest.raises(ValueError, match="max_seqlen_q"):
        call_varlen(q, k, v, cu, cu, max_seqlen - 1, max_seqlen)
    with pytest.raises(TypeError, match="set_value_checks takes"):
        flashtile.set_value_checks(1)



def test_interpreter_set_after_triton_loaded():
    """TRITON_INTERPRET=1 set after triton was imported cannot take effect: one line says so, not the
    interpreter's 66-line traceback."""
    import os
    import subprocess
    import sys
    code = ("import os, torch, triton; os.environ['TRITON_INTERPRET'] = '1'; import flashtile; "
            "q = torch.randn(1, 8, 1, 16, dtype=torch.float16); flashtile.flash_attn_func(q, q, q)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "RuntimeError: TRITON_INTERPRET=1 was set after triton was imported, so its kernels cannot run under the "
        "interpreter: set it before the first import of triton (or of torch._inductor)")
