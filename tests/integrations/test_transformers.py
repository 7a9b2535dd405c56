"""flashtile.integrations.transformers: tiny random-weight models run every layer on flashtile and match the same
weights on transformers' sdpa: logits over padded (right and left), packed and plain batches, loss and gradients,
and greedy generate() tokens, in float32 on the CPU tier (flashtile's float32 is exact); on the GPU tier, models at
a real layer's width in bf16, within 2x of PyTorch's own bf16 error against the same weights in float32."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers import DEVICE  # noqa: E402

import flashtile.integrations.transformers as flashtile_hf  # noqa: E402

flashtile_hf.register()


SIZES = {  # a tiny model for the CPU tier; one at a real layer's width (head dim 128) for the GPU tier
    "tiny": dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128),
    "real": dict(vocab_size=1024, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096, head_dim=128)}
WINDOWS = {"tiny": dict(mistral=5, other=6, head_dim=16, softcap=1.5), "real": dict(mistral=200, other=256,
                                                                                  head_dim=128, softcap=5.0)}


def tiny(kind="llama", size="tiny"):
    """A random model of ``kind`` (GQA), on sdpa (gemma2, gpt-oss: eager, their only other) and on flashtile, same
    weights, float32; the sinks drawn away from zero so that they matter. ``size`` "real": 8 heads of 128 over 2 KV
    heads, 1024 wide, windows of a few hundred keys."""
    base, w = SIZES[size], WINDOWS[size]
    if kind == "llama":
        config = transformers.LlamaConfig(**base)
        cls = transformers.LlamaForCausalLM
    elif kind == "mistral":  # a sliding window shorter than the prompts
        config = transformers.MistralConfig(**base, sliding_window=w["mistral"])
        cls = transformers.MistralForCausalLM
    elif kind == "gpt_oss":  # attention sinks (s_aux), sliding-window layers, a small mixture of experts
        config = transformers.GptOssConfig(**dict(base, head_dim=w["head_dim"]), sliding_window=w["other"],
                                           num_local_experts=2, num_experts_per_tok=1, initializer_range=0.1)
        cls = transformers.GptOssForCausalLM
    else:  # gemma2: softcap on the attention logits, sliding-window layers
        config = transformers.Gemma2Config(**dict(base, head_dim=w["head_dim"]), sliding_window=w["other"],
                                           attn_logit_softcapping=w["softcap"], initializer_range=0.1,
                                           final_logit_softcapping=None, query_pre_attn_scalar=w["head_dim"])
        cls = transformers.Gemma2ForCausalLM
    torch.manual_seed(0)
    # each model its own config: a model reads its attention implementation from its config at every call
    ref = cls._from_config(copy.deepcopy(config), attn_implementation="sdpa" if kind in ("llama",
                                                                                         "mistral") else "eager")
    ours = cls._from_config(copy.deepcopy(config), attn_implementation=flashtile_hf.NAME)
    ref, ours = ref.to(DEVICE).eval(), ours.to(DEVICE).eval()
    assert ref.config._attn_implementation != ours.config._attn_implementation == flashtile_hf.NAME
    if kind == "gpt_oss":
        with torch.no_grad():
            for layer in ref.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def batch(padding, lengths=(11, 7), vocab=97):
    """Token ids and a 2-D attention mask, padded on the given side (None: equal lengths, no mask)."""
    torch.manual_seed(1)
    longest = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), longest), device=DEVICE)
    if padding is None:
        return ids, None
    mask = torch.zeros(len(lengths), longest, dtype=torch.long, device=DEVICE)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    if padding == "left":
        mask = mask.flip(1)
    return ids * mask, mask


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2", "gpt_oss"])
@pytest.mark.parametrize("padding", [None, "right", "left"])
def test_logits_match_sdpa(kind, padding):
    ref, ours = tiny(kind)
    ids, mask = batch(padding)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    torch.testing.assert_close(got[keep], want[keep], atol=2e-4, rtol=1e-4)


def test_loss_and_gradients_match_sdpa():
    ref, ours = tiny()
    ids, mask = batch("right")
    labels = ids.masked_fill(mask == 0, -100)
    for model in (ref, ours):
        model.train()
        model.zero_grad()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    ref_loss = ref(input_ids=ids, attention_mask=mask, labels=labels).loss
    ours_loss = ours(input_ids=ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(ours_loss, ref_loss, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(ref.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=2e-4, rtol=1e-3, msg=name)


def test_packed_sequences_by_position_ids():
    """Padding-free packing: two sequences in one row, position ids restarting at 0; each sequence's logits equal
    the same sequence run alone on sdpa."""
    ref, ours = tiny()
    first, second = (torch.randint(1, 97, (1, n), device=DEVICE) for n in (6, 9))
    ids = torch.cat([first, second], 1)
    positions = torch.cat([torch.arange(6), torch.arange(9)])[None].to(DEVICE)
    with torch.no_grad():
        got = ours(input_ids=ids, position_ids=positions).logits
        want = torch.cat([ref(input_ids=first).logits, ref(input_ids=second).logits], 1)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_greedy_generate_matches_sdpa():
    ref, ours = tiny()
    ids, mask = batch("left")
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    want = ref.generate(input_ids=ids, attention_mask=mask, **settings)
    got = ours.generate(input_ids=ids, attention_mask=mask, **settings)
    assert torch.equal(got, want)


def test_sinks_gradients_match_eager():
    """gpt-oss's learned sinks: the loss and the sinks' own gradients (and every other parameter's) as eager."""
    ref, ours = tiny("gpt_oss")
    ids, mask = batch("left")
    labels = ids.masked_fill(mask == 0, -100)
    losses = []
    for model in (ref, ours):
        model.train()
        model.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(ref.named_parameters(), ours.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, atol=2e-4, rtol=1e-3, msg=name)
    assert ours.model.layers[0].self_attn.sinks.grad.abs().max() > 0


def test_unpad_and_pad_are_inverse():
    x = torch.randn(3, 5, 2, device=DEVICE)
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool, device=DEVICE)
    rows, index, cu, longest = flashtile_hf.unpad(x, mask)
    assert rows.shape == (11, 2) and cu.tolist() == [0, 2, 6, 11] and longest == 5
    assert cu.dtype == torch.int32
    back = flashtile_hf.pad(rows, index, 3, 5)
    assert torch.equal(back[mask], x[mask]) and not back[~mask].any()


def test_padding_is_derived_once_a_forward(monkeypatch):
    """The packed indices of a padding mask (a host sync) come once a forward, not once a layer."""
    ref, ours = tiny()
    ids, mask = batch("left")
    calls = []
    real = flashtile_hf.unpad_input
    monkeypatch.setattr(flashtile_hf, "unpad_input", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        ours(input_ids=ids, attention_mask=mask)
    assert len(calls) == 2  # keys and queries, for both layers


def bf16_trio(kind):
    """The real-size model in float32 (the reference), on PyTorch's attention in bf16 and on flashtile in bf16."""
    truth, ours = tiny(kind, "real")
    return truth, copy.deepcopy(truth).to(torch.bfloat16), ours.to(torch.bfloat16)


def max_error(got, want):
    return (got.float() - want.float()).abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2", "gpt_oss"])
@pytest.mark.parametrize("padding", ["right", "left"])
def test_bf16_logits_within_pytorchs_error(kind, padding):
    """Two prompts of 900 and 600 tokens: flashtile's bf16 logits are within 2x of PyTorch's bf16 error (sdpa;
    gemma2, gpt-oss: eager) against float32, on every unpadded position."""
    truth, theirs, ours = bf16_trio(kind)
    ids, mask = batch(padding, (900, 600), vocab=1024)
    with torch.no_grad():
        want, pt, got = (m(input_ids=ids, attention_mask=mask).logits for m in (truth, theirs, ours))
    keep = mask.bool()
    assert max_error(got[keep], want[keep]) <= 2 * max_error(pt[keep], want[keep]) + 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["llama", "gpt_oss"])
def test_bf16_loss_and_gradients_within_pytorchs_error(kind):
    """Training in bf16 (GQA; gpt-oss: the sinks' gradients too): the loss and every parameter's gradient within 2x
    of PyTorch's bf16 error against float32."""
    truth, theirs, ours = bf16_trio(kind)
    ids, mask = batch("right", (700, 500), vocab=1024)
    labels = ids.masked_fill(mask == 0, -100)
    losses = []
    for model in (truth, theirs, ours):
        model.train()
        model.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        losses.append(loss.detach().float())
    assert abs(losses[2] - losses[0]) <= 2 * abs(losses[1] - losses[0]) + 1e-3
    for (name, want), pt, got in zip(truth.named_parameters(), theirs.parameters(), ours.parameters()):
        if want.grad is not None:
            bound = 2 * max_error(pt.grad, want.grad) + 1e-2 * want.grad.abs().max().item()
            assert max_error(got.grad, want.grad) <= bound, name


@pytest.mark.gpu
def test_bf16_greedy_generate_follows_float32_as_closely_as_pytorch():
    """Greedy tokens in bf16 after left-padded prompts: flashtile's agree with float32's at least as often as PyTorch's
    bf16 tokens do, less two (near-ties may fall either way)."""
    truth, theirs, ours = bf16_trio("llama")
    ids, mask = batch("left", (300, 200), vocab=1024)
    settings = dict(max_new_tokens=16, do_sample=False, pad_token_id=0)
    want, pt, got = (m.generate(input_ids=ids, attention_mask=mask, **settings)[:, ids.shape[1]:]
                     for m in (truth, theirs, ours))
    assert (got == want).sum().item() >= (pt == want).sum().item() - 2
