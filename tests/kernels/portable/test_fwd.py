"""The portable forward (kernels/portable/fwd.py) against the float64 reference, on any machine (the Triton
interpreter, fp16/fp32). Its GPU cases run with the sm90 forward's, on both backends:
tests/kernels/hopper/test_fwd.py."""
import pytest
import torch
import torch.nn.functional as F
from helpers import (
    DTYPE_IDS,
    assert_attention_close,
    poisoned_outputs,
    randn,
    torch_attention,
    torch_attention_varlen,
    varlen_inputs,
)

import flashtile
from flashtile import reference

DTYPES = [torch.float16, torch.float32]


def run_case(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal=False, window_size=(-1, -1),
             scale=1.0, make=None):
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype, scale=scale)
    k = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    v = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    if make is not None:
        q, k, v = make(q), make(k), make(v)
    with poisoned_outputs():
        out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=causal, window_size=window_size,
                                                return_attn_probs=True)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, window_size=window_size)
    assert out.shape == q.shape and lse.shape == (batch, q.shape[2], seqlen_q) and lse.dtype == torch.float32
    assert_attention_close(out, ref, torch_attention(q, k, v, causal, window_size), lse, ref_lse)
    return out, lse


def _awkward_cases():
    """Every short length with every head dim and dtype; 1023 only at fp16 d64/d256 (interpreter time)."""
    for seqlens in [(1, 1), (17, 17), (63, 63), (113, 203), (203, 113), (1023, 1023)]:
        for head_dim in [40, 59, 64, 96, 111, 128, 256]:
            for dtype in DTYPES:
                if head_dim in (59, 111) and (dtype != torch.float16 or seqlens[0] == 1023):
                    continue  # padded to 64 and 112 (ops.flash_attention): one dtype shows it
                if seqlens[0] < 1000 or (head_dim in (64, 256) and dtype == torch.float16):
                    yield pytest.param(seqlens, head_dim, dtype,
                                       id=f"q{seqlens[0]}k{seqlens[1]}-d{head_dim}-{DTYPE_IDS[dtype]}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens, head_dim, dtype", list(_awkward_cases()))
def test_awkward_shapes(seqlens, head_dim, dtype, causal):
    run_case(2 if seqlens[0] < 200 else 1, *seqlens, 2, 2, head_dim, dtype, causal)


@pytest.mark.parametrize("seqlens", [(64, 200), (200, 64), (1, 77), (77, 1)], ids=lambda s: f"q{s[0]}k{s[1]}")
def test_causal_alignment(seqlens):
    """flash-attn aligns the causal mask bottom-right, PyTorch's SDPA top-left; both hold when Nq != Nk."""
    seqlen_q, seqlen_k = seqlens
    q = randn(1, seqlen_q, 2, 64, dtype=torch.float16)
    k = randn(1, seqlen_k, 2, 64, dtype=torch.float16)
    v = randn(1, seqlen_k, 2, 64, dtype=torch.float16)
    for bottom_right in (True, False):
        with poisoned_outputs():
            if bottom_right:
                out = flashtile.flash_attn_func(q, k, v, causal=True)
            else:
                out = flashtile.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                             v.transpose(1, 2), is_causal=True).transpose(1, 2)
        ref, _ = reference.attention(q, k, v, causal=True, bottom_right=bottom_right)
        assert_attention_close(out, ref, torch_attention(q, k, v, True, bottom_right=bottom_right))


@pytest.mark.parametrize("nheads_k", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa_mqa(nheads_k, causal):
    run_case(2, 97, 131, 8, nheads_k, 64, torch.float16, causal)


@pytest.mark.parametrize("window_size", [(0, 0), (16, -1), (-1, 5), (40, 7), (3, 200)],
                         ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("seqlens", [(150, 150), (90, 170), (170, 90)], ids=lambda s: f"q{s[0]}k{s[1]}")
def test_sliding_window(seqlens, window_size):
    run_case(1, *seqlens, 2, 1, 64, torch.float16, window_size=window_size)


def test_causal_sliding_window():
    run_case(1, 150, 150, 2, 2, 64, torch.float16, causal=True, window_size=(31, -1))


def test_fully_masked_rows_give_zero_and_minus_inf():
    """Bottom-right causal with Nq > Nk leaves the first Nq - Nk rows nothing to attend to."""
    out, lse = run_case(1, 150, 40, 2, 2, 64, torch.float16, causal=True)
    assert torch.equal(out[:, :110], torch.zeros_like(out[:, :110]))
    assert (lse[:, :, :110] == float("-inf")).all() and torch.isfinite(lse[:, :, 110:]).all()


def test_window_rows_with_no_key():
    """A left window with Nq > Nk: the first rows' windows lie before key 0."""
    out, lse = run_case(1, 100, 30, 2, 2, 32, torch.float16, window_size=(5, 0))
    assert torch.equal(out[:, :70], torch.zeros_like(out[:, :70])) and (lse[:, :, :70] == float("-inf")).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_large_logits(dtype):
    """Queries scaled x30: scores far beyond exp's range, which only a running max survives."""
    run_case(1, 200, 200, 2, 2, 64, dtype, causal=True, scale=30.0)


def test_non_contiguous_inputs():
    """Views of transposed tensors: (batch, nheads, seqlen, headdim) storage seen as flash-attn layout."""
    run_case(2, 70, 90, 4, 2, 64, torch.float16, make=lambda t: t.transpose(1, 2).contiguous().transpose(1, 2))
    run_case(1, 70, 90, 2, 2, 64, torch.float16, make=lambda t: t[..., ::2, :])


def test_head_dim_not_unit_stride_is_copied():
    q, k, v = (randn(1, 33, 2, 128, dtype=torch.float16)[..., ::2] for _ in range(3))
    out = flashtile.flash_attn_func(q, k, v)
    ref, _ = reference.attention(q, k, v)
    assert_attention_close(out, ref, torch_attention(q, k, v))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen(causal):
    seqlens_q, seqlens_k = [5, 0, 70, 1, 33], [9, 12, 70, 0, 130]
    q, k, v, cu_q, cu_k = varlen_inputs(seqlens_q, seqlens_k, 4, 2, 64, torch.float16)
    with poisoned_outputs():
        out, lse, _ = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                                                       causal=causal, return_attn_probs=True)
    ref, ref_lse = reference.attention_varlen(q, k, v, cu_q, cu_k, causal=causal)
    assert lse.shape == (4, sum(seqlens_q))
    assert_attention_close(out, ref, torch_attention_varlen(q, k, v, cu_q, cu_k, causal), lse, ref_lse)


def test_varlen_window_and_padding_tail():
    """Packed tensors may hold more rows than cu_seqlens uses: those rows belong to no sequence, and get O = 0 and
    LSE = -inf (never what memory held before)."""
    seqlens = [40, 100, 7]
    q, k, v, cu_q, cu_k = varlen_inputs(seqlens, seqlens, 2, 2, 32, torch.float16)
    q_pad = torch.cat([q, randn(21, 2, 32, dtype=torch.float16)])
    with poisoned_outputs():
        out, lse, _ = flashtile.flash_attn_varlen_func(q_pad, k, v, cu_q, cu_k, 100, 100, window_size=(10, 3),
                                                       return_attn_probs=True)
    ref, _ = reference.attention_varlen(q, k, v, cu_q, cu_k, window_size=(10, 3))
    assert_attention_close(out[:147], ref, torch_attention_varlen(q, k, v, cu_q, cu_k, window_size=(10, 3)))
    assert torch.equal(out[147:], torch.zeros_like(out[147:]))
    assert (lse[:, 147:] == float("-inf")).all() and lse.shape == (2, 168)


def test_arguments_as_flash_attn_passes_them():
    """flash-attn takes window_size as an int64 tensor (its own tests) and max_seqlen as a 0-d tensor
    (transformers: cu_seq_lens.diff().max()); the results equal those of plain ints."""
    q, k, v, cu_q, cu_k = varlen_inputs([30, 50], [40, 20], 2, 1, 64, torch.float16)
    plain = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 50, 40, causal=True, window_size=(7, 0))
    tensors = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, cu_q.diff().max(), cu_k.diff().max(), causal=True,
                                               window_size=torch.tensor([7, 3]))
    assert torch.equal(plain, tensors)
    q, k, v = (randn(1, 45, 2, 64, dtype=torch.float16) for _ in range(3))
    window = torch.randint(0, 45, (2,))
    left, right = window.tolist()
    assert torch.equal(flashtile.flash_attn_func(q, k, v, window_size=window),
                       flashtile.flash_attn_func(q, k, v, window_size=(left, right)))
    assert torch.equal(flashtile.flash_attn_func(q, k, v, window_size=(window[0], window[1])),
                       flashtile.flash_attn_func(q, k, v, window_size=(left, right)))


def test_sdpa_head_dim_not_a_multiple_of_8():
    q, k, v = (randn(2, 3, 33, 59, dtype=torch.float16) for _ in range(3))
    out = flashtile.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    baseline = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.shape == q.shape
    assert_attention_close(out, expected, baseline)


def test_sdpa_matches_torch_semantics():
    q = randn(2, 4, 77, 64, dtype=torch.float16)
    k = randn(2, 2, 50, 64, dtype=torch.float16)
    v = randn(2, 2, 50, 64, dtype=torch.float16)
    for causal in (False, True):
        with poisoned_outputs():
            out = flashtile.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3, enable_gqa=True)
        expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                                  scale=0.3, enable_gqa=True).nan_to_num(0.0)
        baseline = torch_attention(*(t.transpose(1, 2) for t in (q, k, v)), causal, bottom_right=False,
                                   softmax_scale=0.3).transpose(1, 2)
        assert out.shape == q.shape and out.is_contiguous()
        assert_attention_close(out, expected, baseline)


def test_softmax_scale():
    q, k, v = (randn(1, 40, 2, 64, dtype=torch.float16) for _ in range(3))
    out = flashtile.flash_attn_func(q, k, v, softmax_scale=0.05)
    ref, _ = reference.attention(q, k, v, softmax_scale=0.05)
    assert_attention_close(out, ref, torch_attention(q, k, v, softmax_scale=0.05))


def test_empty_inputs():
    q = randn(2, 5, 2, 64, dtype=torch.float16)
    kv = randn(2, 0, 2, 64, dtype=torch.float16)
    out, lse, _ = flashtile.flash_attn_func(q, kv, kv, return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(out)) and (lse == float("-inf")).all()
    empty_q = randn(2, 0, 2, 64, dtype=torch.float16)
    assert flashtile.flash_attn_func(empty_q, q, q).shape == (2, 0, 2, 64)


def test_run_to_run_deterministic():
    q, k, v = (randn(2, 300, 4, 64, dtype=torch.float16) for _ in range(3))
    first = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    second = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
