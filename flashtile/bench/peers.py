"""The attention implementations users pick today. Each entry makes (prepare, run) for a mask (``causal``: True, False,
or a sliding window (left, right) where the peer takes one): ``prepare`` turns flash-attn layout (batch, seqlen,
nheads, headdim) inputs into fresh leaf tensors in the peer's own layout, outside the timed call; ``run(q, k, v)`` is
what gets timed."""
from dataclasses import replace

import torch.nn.functional as F

from .. import reference


def window_of(causal):
    """(causal flag, flash-attn window_size) of a bench mask: True, False or a window (left, right)."""
    return (False, tuple(causal)) if isinstance(causal, (tuple, list)) else (bool(causal), (-1, -1))


def no_window(name, causal):
    """Raises for a peer that has no sliding window."""
    if isinstance(causal, (tuple, list)):
        raise NotImplementedError(f"{name} takes no sliding window")


def flashtile_fwd(causal, backend="auto", bwd_backend="auto", single_pass=None, sinks=False, softcap=0.0):
    """``backend`` "portable" keeps sm90 off the warp-specialized Hopper forward (configs.FWD_BACKEND);
    ``bwd_backend`` is the backward the following .backward() runs (configs.BWD_BACKEND, left set), and
    ``single_pass`` (None: as shipped) the sm90 backward's design (configs.HopperBwdConfig.single_pass, left set).
    ``sinks``: with a learned sink logit per head (learnable_sink, float32, taking a gradient in the backward);
    ``softcap``: flash-attn's (scores capped at ±softcap by tanh)."""
    import torch

    from .. import configs, flash_attn_func
    shipped = dict(configs.BWD_HOPPER)
    table = shipped if single_pass is None else {key: replace(c, single_pass=single_pass)
                                                 for key, c in shipped.items()}

    def prepare(q, k, v):
        extra = (torch.randn(q.shape[2], device=q.device), ) if sinks else ()
        return q.detach(), k.detach(), v.detach(), *extra

    flag, window = window_of(causal)

    def run(q, k, v, learnable_sink=None):
        configs.BWD_BACKEND = bwd_backend
        configs.BWD_HOPPER = table
        saved, configs.FWD_BACKEND = configs.FWD_BACKEND, backend
        try:
            return flash_attn_func(q, k, v, causal=flag, window_size=window, learnable_sink=learnable_sink,
                                   softcap=softcap)
        finally:
            configs.FWD_BACKEND = saved
    return prepare, run


def sdpa_fwd(backend, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    no_window(backend, causal)
    chosen = getattr(SDPBackend, backend)

    def prepare(q, k, v):
        return tuple(t.transpose(1, 2).contiguous().detach() for t in (q, k, v))

    def run(q, k, v):
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return prepare, run


def flex_fwd(causal):
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    no_window("FlexAttention", causal)
    torch._dynamo.config.cache_size_limit = 1000
    torch._dynamo.config.accumulated_cache_size_limit = 1000
    compiled = torch.compile(flex_attention, dynamic=False)
    state = {}

    def prepare(q, k, v):
        q, k, v = (t.transpose(1, 2).contiguous().detach() for t in (q, k, v))
        state["mask"] = None
        if causal:
            state["mask"] = create_block_mask(lambda b, h, i, j: i >= j, None, None, q.shape[2], k.shape[2],
                                              device=q.device)
        return q, k, v
    return prepare, lambda q, k, v: compiled(q, k, v, block_mask=state["mask"],
                                             enable_gqa=q.shape[1] != k.shape[1])


def fa4_fwd(causal, softcap=0.0):
    """flash-attn-4 (CuTe DSL), where installed (its wheels on the device: docs/perf/backward.md, "FA4 on the
    device"); ``softcap`` as flashtile_fwd's."""
    from flash_attn.cute.interface import flash_attn_func as fa4
    flag, window = window_of(causal)
    window = tuple(None if w < 0 else w for w in window)  # FA4's unbounded side is None

    def prepare(q, k, v):
        return q.detach(), k.detach(), v.detach()

    def run(q, k, v):
        out = fa4(q, k, v, causal=flag, window_size=window, **({"softcap": softcap} if softcap else {}))
        return out[0] if isinstance(out, tuple) else out
    return prepare, run


def naive_fwd(causal):
    flag, window = window_of(causal)

    def prepare(q, k, v):
        return q.detach(), k.detach(), v.detach()
    return prepare, lambda q, k, v: reference.attention(q, k, v, causal=flag, window_size=window, upcast=False)[0]


FORWARD = {
    "flashtile": flashtile_fwd,
    "flashtile (portable)": lambda causal: flashtile_fwd(causal, "portable", "portable"),
    "flashtile (bwd single pass)": lambda causal: flashtile_fwd(causal, "auto", "auto", True),
    "flashtile (bwd two kernels)": lambda causal: flashtile_fwd(causal, "auto", "auto", False),
    "flashtile (sinks)": lambda causal: flashtile_fwd(causal, sinks=True),
    "flashtile (softcap 50)": lambda causal: flashtile_fwd(causal, softcap=50.0),  # Gemma 2's cap
    "flashtile (portable, softcap 50)": lambda causal: flashtile_fwd(causal, "portable", "portable", softcap=50.0),
    "FA4": fa4_fwd,
    "FA4 (softcap 50)": lambda causal: fa4_fwd(causal, softcap=50.0),
    "cuDNN": lambda causal: sdpa_fwd("CUDNN_ATTENTION", causal),
    "FA2 (SDPA flash)": lambda causal: sdpa_fwd("FLASH_ATTENTION", causal),
    "mem-efficient": lambda causal: sdpa_fwd("EFFICIENT_ATTENTION", causal),
    "FlexAttention": flex_fwd,
    "naive": naive_fwd,
}


# What a peer computes beyond plain attention, where it does: the ratio column compares peers of one setting.
SETTING = {peer: "softcap 50" for peer in ("flashtile (softcap 50)", "flashtile (portable, softcap 50)",
                                           "FA4 (softcap 50)")}


def setting(peer):
    """The peer's SETTING ("" for plain attention)."""
    return SETTING.get(peer, "")


# What the bench runs unless --peers says otherwise: flashtile as shipped and every peer a user can pick.
DEFAULT_PEERS = ["flashtile", "FA4", "cuDNN", "FA2 (SDPA flash)", "FlexAttention", "mem-efficient", "naive"]
