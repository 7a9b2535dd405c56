"""GPU tier (`pytest -m gpu`): backward at real sizes, torch.compile with inductor, a short training run."""
import pytest
import test_bwd
import torch
import torch.nn.functional as F
from helpers import DTYPE_IDS, randn, torch_attention, torch_attention_varlen, varlen_inputs
from test_bwd import Block, _slopes, assert_grads_close, gradients, negative_scores

import flashtile
from flashtile import configs, reference

pytestmark = pytest.mark.gpu


def check(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal, deterministic=False,
          window_size=(-1, -1)):
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    k = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    v = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    dout = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    ours = gradients(lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=causal, window_size=window_size,
                                                               deterministic=deterministic), (q, k, v), dout)
    ref = gradients(lambda q, k, v: reference.attention(q, k, v, causal=causal, window_size=window_size)[0],
                    (q, k, v), dout.double())
    base = gradients(lambda q, k, v: torch_attention(q, k, v, causal, window_size), (q, k, v), dout)
    assert_grads_close(ours, ref, base)


def _cases():
    for head_dim in (64, 128, 256):
        for seqlen in (1024, 4096, 8192):
            for dtype in (torch.bfloat16, torch.float16):
                if seqlen == 8192 and dtype != torch.bfloat16:
                    continue
                yield pytest.param(seqlen, head_dim, dtype, id=f"n{seqlen}-d{head_dim}-{DTYPE_IDS[dtype]}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen, head_dim, dtype", list(_cases()))
def test_large_gradients(seqlen, head_dim, dtype, causal):
    check(1, seqlen, seqlen, 2, 2, head_dim, dtype, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_portable_backward_where_the_sm90_kernel_runs_by_default(monkeypatch, causal):
    """D=128 goes to kernels/hopper/bwd.py on sm90; FLASHTILE_BWD_BACKEND=portable must still
    give the one-launch portable backward there, and it must stay right."""
    monkeypatch.setattr(configs, "BWD_BACKEND", "portable")
    check(2, 4096, 4096, 4, 2, 128, torch.bfloat16, causal)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("head_dim", [40, 96, 128], ids=lambda d: f"d{d}")
def test_ragged_gqa_gradients(head_dim, deterministic):
    check(2, 1000, 3001, 8, 2, head_dim, torch.bfloat16, True, deterministic)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(1, 64), (17, 64), (1000, 64), (1000, 128), (2049, 128), (300, 256)],
                         ids=lambda s: f"n{s[0]}-d{s[1]}")
def test_large_negative_scores_gradients(shape, dtype, deterministic):
    """Scores of about -50 (negative_scores) with a ragged last K/V tile, on every backward the GPU picks: the
    portable one (dQ by bulk reduce-add at D=64 non-causal under 4k keys, Q-tile programs at D=128 under 2k keys)
    and the sm90 Gluon kernels (D=64 causal, D=128 from 2k keys, D=256 at every length)."""
    seqlen, head_dim = shape
    test_bwd.check(2, seqlen, seqlen, 3, 3, head_dim, dtype, False, deterministic=deterministic,
                   inputs=negative_scores)


def test_window_gradients():
    check(1, 2048, 2048, 4, 1, 128, torch.bfloat16, False, window_size=(256, 0))


def test_varlen_gradients():
    seqlens_q, seqlens_k = [1, 0, 2048, 300, 1500], [1, 129, 2048, 2000, 0]
    q, k, v, cu_q, cu_k = varlen_inputs(seqlens_q, seqlens_k, 8, 2, 128, torch.bfloat16)
    dout = randn(*q.shape, dtype=torch.bfloat16)
    ours = gradients(lambda q, k, v: flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2048, 2048, causal=True),
                     (q, k, v), dout)
    ref = gradients(lambda q, k, v: reference.attention_varlen(q, k, v, cu_q, cu_k, causal=True)[0], (q, k, v),
                    dout.double())
    base = gradients(lambda q, k, v: torch_attention_varlen(q, k, v, cu_q, cu_k, True), (q, k, v), dout)
    assert_grads_close(ours, ref, base)


def assert_graph_replays_like_eager(step, inputs):
    """Capture step() in a CUDA graph, refill the inputs with fresh random values and replay: every output
    must equal an eager step's bitwise."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        for t in inputs:
            t.copy_(randn(*t.shape, dtype=t.dtype))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, step()):
        assert torch.equal(got, want)


def test_varlen_forward_backward_replay_in_cuda_graph():
    """Varlen kernels build their descriptors on the device, in memory from Triton's allocator: a captured
    step must replay on new inputs and match eager bitwise (deterministic dQ)."""
    seqlens = [5, 2048, 700]
    q, k, v, cu_q, cu_k = varlen_inputs(seqlens, seqlens, 8, 2, 128, torch.bfloat16)
    dout = randn(*q.shape, dtype=torch.bfloat16)
    for t in (q, k, v):
        t.requires_grad_()

    def step():
        out = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2048, 2048, causal=True, deterministic=True)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    assert_graph_replays_like_eager(step, (q, k, v, dout))


def test_deterministic_is_bitwise_reproducible():
    q, k, v, dout = (randn(2, 4096, h, 128, dtype=torch.bfloat16) for h in (16, 4, 4, 16))
    runs = [gradients(lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=True, deterministic=True),
                      (q, k, v), dout) for _ in range(3)]
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))


def test_torch_compile_inductor_fullgraph():
    torch.manual_seed(0)
    model = Block(dim=1024, nheads=8).cuda().to(torch.bfloat16)
    x = randn(4, 1024, 1024, dtype=torch.bfloat16)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    out.float().square().mean().backward()
    assert (out.float() - eager.float()).abs().max().item() < 2e-2


class TinyTransformer(torch.nn.Module):
    """Two pre-norm blocks; ``attention`` is flash_attn_func-shaped."""

    def __init__(self, attention, dim=256, nheads=4, layers=2, vocab=512):
        super().__init__()
        self.attention, self.nheads = attention, nheads
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict(dict(
            norm1=torch.nn.LayerNorm(dim), qkv=torch.nn.Linear(dim, 3 * dim), proj=torch.nn.Linear(dim, dim),
            norm2=torch.nn.LayerNorm(dim), mlp=torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                                                   torch.nn.Linear(4 * dim, dim))))
            for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        b, n, d = x.shape
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["norm1"](x)).view(b, n, 3, self.nheads, d // self.nheads).unbind(2)
            x = x + blk["proj"](self.attention(q, k, v).reshape(b, n, d))
            x = x + blk["mlp"](blk["norm2"](x))
        return self.head(x)


def sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=True).transpose(1, 2)


def test_training_losses_track_sdpa():
    losses = {}
    for name, attention in (("flashtile", lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=True)),
                            ("sdpa", sdpa_attention)):
        torch.manual_seed(0)
        model = TinyTransformer(attention).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.randint(0, 512, (8, 257), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        losses[name] = []
        for _ in range(30):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(data[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, 512), data[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    ours, theirs = torch.tensor(losses["flashtile"]), torch.tensor(losses["sdpa"])
    assert ours[-1] < ours[0] - 0.5, "the model did not learn"
    assert (ours - theirs).abs().max().item() < 0.1, (losses["flashtile"], losses["sdpa"])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softcap_alibi_gradients_bf16(causal):
    """softcap 30 and ALiBi together at D=128 in bf16 (the portable kernels take these calls on sm90 too)."""
    q = randn(2, 1024, 8, 128, dtype=torch.bfloat16, scale=2.0)
    k, v = (randn(2, 1536, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    dout = randn(2, 1024, 8, 128, dtype=torch.bfloat16)
    kwargs = dict(causal=causal, softcap=30.0, alibi_slopes=_slopes(8))
    ours = gradients(lambda q, k, v: flashtile.flash_attn_func(q, k, v, **kwargs), (q, k, v), dout)
    ref = gradients(lambda q, k, v: reference.attention(q, k, v, **kwargs)[0], (q, k, v), dout.double())
    base = gradients(lambda q, k, v: reference.attention(q, k, v, upcast=False, **kwargs)[0], (q, k, v), dout)
    assert_grads_close(ours, ref, base)


@pytest.mark.parametrize("backend, head_dim, causal, deterministic", [
    ("portable", 128, True, False), ("portable", 64, False, True), ("auto", 128, False, False),
    ("auto", 128, True, False), ("auto", 64, True, True), ("auto", 256, False, False)],
    ids=["portable-d128-causal", "portable-d64-deterministic", "hopper-d128-one-pass", "hopper-d128-causal",
         "hopper-d64-deterministic", "hopper-d256"])
def test_a_repeated_backward_replays_its_launches(backend, head_dim, causal, deterministic, monkeypatch):
    """A training loop repeats its shapes: from the second step every backward launch is replayed
    (kernels/common/replay.py) with the step's own tensors, and the gradients stay right."""
    from flashtile.kernels.common import replay
    if backend == "auto" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 backward")
    monkeypatch.setattr(configs, "BWD_BACKEND", backend)
    replayed = []
    launch = replay.Replay.launch
    monkeypatch.setattr(replay.Replay, "launch", lambda self, *a: (replayed.append(self), launch(self, *a))[1])
    for _ in range(2):
        replayed.clear()
        check(2, 300, 300, 4, 2, head_dim, torch.bfloat16, causal, deterministic)
    assert replayed or not replay.REPLAY_OK
