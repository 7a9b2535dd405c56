"""Which kernel and which config serve a call: the rules over the tables of flashtile/configs.py, in one place.
ops.py asks here (``forward``, ``backward`` and ``decode`` return a Plan, which ``flashtile info`` prints). Each rule
reads the tables when it is called, so tests and sweeps may swap a table in configs."""
import functools
import importlib
from dataclasses import replace
from types import ModuleType
from typing import NamedTuple, Optional, Union

import torch

from . import configs
from .checks import interpreter_enabled
from .kernels.common.tiles import head_dim_pad, is_causal, num_sms, window_keys
from .kernels.portable.decode import reads_by_tma


class Plan(NamedTuple):
    """What serves a call: the kernel file under flashtile/kernels/ whose launcher runs it, its config, for the
    sm90 backward the design (configs.HopperBwdConfig.design: the launches in order), for decoding the splits of
    the cache and the keys each split takes. A named tuple: decoding builds one every step."""
    kernel: str
    config: object
    design: str = ""
    splits: int = 1
    chunk: int = 0

    def __str__(self) -> str:
        split = f", {self.splits} split{'s' if self.splits > 1 else ''} of {self.chunk} keys" if self.chunk else ""
        return f"kernels/{self.kernel}" + (f" ({self.design})" if self.design else "") + f" with {self.config}" + split


@functools.lru_cache(maxsize=None)
def arch(device: torch.device) -> Optional[tuple[int, int]]:
    """(major, minor) of a CUDA device; None for the CPU."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


@functools.cache
def hopper(module: str) -> ModuleType:
    """The kernels/hopper module ``module``, imported on first use: Gluon loads only once a call may run on it (a
    cached lookup, not an import statement, on every eager call)."""
    return importlib.import_module(f".kernels.hopper.{module}", __package__)


def runs_gluon(device: torch.device) -> bool:
    """Whether the sm90 Gluon kernels can run here: an sm90 GPU, not the Triton interpreter."""
    return arch(device) == (9, 0) and not interpreter_enabled()


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: tuple[int, int],
            seqlen_q: Optional[int] = None, softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None) -> Plan:
    """The forward's plan: the sm90 kernel where hopper_forward_config gives a config (no ALiBi), else the portable
    kernel with fwd_config's tiles. ``seqlen_q``: the longest query sequence (q.shape[1] by default)."""
    if alibi_slopes is None:
        config = hopper_forward_config(q, k, v, window_size, seqlen_q, softcap)
        if config is not None:
            return Plan("hopper/fwd.py", config)
    return Plan("portable/fwd.py", fwd_config(head_dim_pad(q.shape[-1]), is_causal(window_size), q.element_size(),
                                              arch(q.device), interpreter_enabled()))


def hopper_forward_config(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: tuple[int, int],
                          seqlen_q: Optional[int] = None, softcap: float = 0.0) -> Optional[configs.HopperFwdConfig]:
    """The sm90 forward's config when it covers the call: an sm90 GPU, not the interpreter, and hopper_forward_pick
    gives a config; else None."""
    return hopper_forward_pick(q, k, v, window_size, seqlen_q, softcap) if runs_gluon(q.device) else None


def hopper_forward_pick(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: tuple[int, int],
                        seqlen_q: Optional[int] = None, softcap: float = 0.0) -> Optional[configs.HopperFwdConfig]:
    """The sm90 forward's config for the call on any device: configs.FWD_BACKEND "auto", the config of the padded head
    dim's chain for the call's query rows (a head dim of 96 runs in tiles of 128), where the config takes the call's
    window (``min_window``) and softcap (``softcap``) and the kernel's ``supports`` takes the call; else None
    (``flashtile info`` says what an sm90 GPU would run)."""
    if configs.FWD_BACKEND == "portable":
        return None
    rows = q.shape[1] if seqlen_q is None else seqlen_q
    chain = configs.hopper_fwd_chain(configs.FWD_HOPPER.get((head_dim_pad(q.shape[-1]), is_causal(window_size))))
    config = next((c for c in chain if rows >= c.min_seqlen_q), None)
    if config is None or (softcap and not config.softcap) or window_keys(window_size) < config.min_window:
        return None
    return config if hopper("fwd_launch").supports(q, k, v, window_size) else None


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, window_size: tuple[int, int],
             packed: bool = False, deterministic: bool = False, softcap: float = 0.0,
             alibi_slopes: Optional[torch.Tensor] = None) -> Plan:
    """The backward's plan: the sm90 kernels (kernels/hopper/bwd.py launches them, in the config's design) on an sm90
    GPU where hopper_backward_pick gives a config (no ALiBi; softcap where the config splits the gradients), else the
    portable backward with bwd_config's tiles."""
    config = None
    if alibi_slopes is None and runs_gluon(q.device):
        config = hopper_backward_pick(q, k, v, dout, window_size, packed, deterministic, softcap)
    if config is not None:
        return Plan("hopper/bwd.py", config, config.design(deterministic))
    return Plan("portable/bwd.py", bwd_config(head_dim_pad(q.shape[-1]), is_causal(window_size), q.element_size(),
                                              arch(q.device), interpreter_enabled()))


def hopper_backward_pick(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
                         window_size: tuple[int, int], packed: bool = False, deterministic: bool = False,
                         softcap: float = 0.0) -> Optional[configs.HopperBwdConfig]:
    """The sm90 backward's config for the call on any device: configs.BWD_BACKEND "auto", a call the kernel's
    ``supports`` accepts; packed sequences where the config's design is the one pass or splits the gradients (D=192,
    256); capped scores (``softcap``) from configs.BWD_HOPPER_SOFTCAP, where it has the head dim; else None
    (``flashtile info`` says what an sm90 GPU would run)."""
    if configs.BWD_BACKEND == "portable" or not hopper("bwd").supports(q, k, v, dout, window_size):
        return None
    config = configs.bwd_hopper_table(softcap).get((head_dim_pad(q.shape[-1]), is_causal(window_size)))
    if config is None:
        return None
    return None if packed and config.design(deterministic) != "one pass" and not config.split_gradients else config


def _portable(tables: tuple, head_dim_pad: int, causal: bool, itemsize: int, arch: Optional[tuple[int, int]],
              interpreter: bool) -> Union[configs.TileConfig, configs.BwdConfig]:
    """The portable kernel's config from ``tables`` (interpreter, float32 by head dim, sm90 by head dim and causal
    flag, any other GPU by head dim): the first that applies, in that order."""
    interpreter_config, fp32, sm90, generic = tables
    if interpreter:
        return interpreter_config
    if itemsize == 4:
        return fp32[head_dim_pad]
    if arch == (9, 0):
        return sm90[(head_dim_pad, causal)]
    return generic[head_dim_pad]


def fwd_config(head_dim_pad: int, causal: bool, itemsize: int, arch: Optional[tuple[int, int]],
               interpreter: bool) -> configs.TileConfig:
    """The portable forward's tiles for a padded head dim, causal flag, element size and (major, minor) arch."""
    tables = (configs.FWD_INTERPRETER, configs.FWD_FP32, configs.FWD_SM90, configs.FWD_GENERIC)
    return _portable(tables, head_dim_pad, causal, itemsize, arch, interpreter)


def bwd_config(head_dim_pad: int, causal: bool, itemsize: int, arch: Optional[tuple[int, int]],
               interpreter: bool) -> configs.BwdConfig:
    """The portable backward's tiles, chosen as fwd_config's."""
    tables = (configs.BWD_INTERPRETER, configs.BWD_FP32, configs.BWD_SM90, configs.BWD_GENERIC)
    return _portable(tables, head_dim_pad, causal, itemsize, arch, interpreter)


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, capacity: int, num_splits: int = 0,
           batch_idx: Optional[torch.Tensor] = None, block_table: Optional[torch.Tensor] = None,
           leftpad: Optional[torch.Tensor] = None, softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
           window_size: tuple[int, int] = (-1, -1), config: Optional[configs.DecodeConfig] = None) -> Plan:
    """flash_attn_with_kvcache's plan: the sm90 decode kernel (one split) where hopper_decode_config gives a config
    (``num_splits`` 0 or 1), else the portable split-KV kernel with its tiles (``config``, or by the cache's layout:
    paged, several KV heads a program, or the plain tables) and its splits (``num_splits``, or by decode_splits),
    each a whole number of tiles. ``capacity``: the keys a sequence may hold."""
    batch, seqlen_q, nheads, head_dim = q.shape
    programs, sms = batch * k_cache.shape[2], num_sms(q.device)
    adjacent = heads_adjacent(k_cache, v_cache)
    if config is None and num_splits <= 1:
        sm90 = hopper_decode_config(q, k_cache, v_cache, batch_idx, block_table, leftpad, softcap, alibi_slopes,
                                    window_size, adjacent, programs, capacity, sms)
        if sm90 is not None:
            return Plan("hopper/decode.py", sm90, splits=1, chunk=capacity)
    interpreter = interpreter_enabled()
    if config is None and not interpreter:
        nheads_k, pad = k_cache.shape[2], head_dim_pad(head_dim)
        rows = nheads // nheads_k * seqlen_q
        if block_table is not None:
            tma = reads_by_tma(k_cache, v_cache)
            config = decode_paged_config(pad, k_cache.shape[1], nheads_k, rows, tma, tma and adjacent, programs,
                                         capacity, sms)
        elif adjacent:  # cheapest test first: this runs on every decode step
            heads = decode_heads_config(pad, nheads_k, rows, programs, capacity, sms)
            config = heads if heads and reads_by_tma(k_cache, v_cache) else None
    programs //= config.heads if config else 1
    if num_splits <= 0:
        num_splits = decode_splits(programs, capacity, sms)
    per_split = -(-capacity // max(num_splits, 1))
    if config is None:
        config = decode_config(head_dim_pad(head_dim), interpreter, decode_waves(programs, sms), per_split)
    chunk = -(-per_split // config.block_n) * config.block_n
    return Plan("portable/decode.py", config, splits=-(-capacity // chunk), chunk=chunk)


def heads_adjacent(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether each key holds its KV heads side by side (flash-attn's contiguous layout, a page pool's)."""
    return all(t.stride(3) == 1 and t.stride(2) == t.shape[3] for t in (k_cache, v_cache))


def hopper_decode_config(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         batch_idx: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                         leftpad: Optional[torch.Tensor], softcap: float, alibi_slopes: Optional[torch.Tensor],
                         window_size: tuple[int, int], adjacent: bool, programs: int, capacity: int,
                         sms: int) -> Optional[configs.DecodeHopperConfig]:
    """The sm90 warp-specialized decode kernel's config where it covers the call: one split over a contiguous
    head-major cache (a key-major one, ``adjacent``, goes to the portable kernel, configs.DECODE_HOPPER), no option
    that masks or biases scores (a causal mask over one new token masks nothing), else None."""
    if (adjacent or not runs_gluon(q.device) or block_table is not None
            or batch_idx is not None or leftpad is not None or softcap or alibi_slopes is not None
            or window_size[0] >= 0 or (window_size[1] >= 0 and q.shape[1] > 1)):
        return None
    config = decode_hopper_config(q.shape[-1], programs, capacity, sms)
    if config is None:
        return None
    return config if hopper("decode").supports(q, k_cache, v_cache) else None


def decode_config(head_dim_pad: int, interpreter: bool, waves: bool = False, chunk: int = 0) -> configs.DecodeConfig:
    """The decode tiles; ``waves``: (batch, KV head) programs alone fill the SMs (one split); ``chunk``: keys per
    program."""
    if interpreter:
        return configs.DECODE_INTERPRETER
    config = configs.DECODE_SM90[head_dim_pad]
    if waves:
        config = configs.DECODE_SM90_WAVES.get(head_dim_pad, config)
    return _grouped(head_dim_pad, config) if chunk >= configs.DECODE_GROUPED_FROM else config


def _grouped(head_dim_pad: int, config: configs.DecodeConfig) -> configs.DecodeConfig:
    return replace(config, key_groups=configs.DECODE_KEY_GROUPS, max_rows=configs.DECODE_GROUPED_MAX_ROWS[head_dim_pad])


def decode_splits(programs: int, capacity: int, num_sms: int) -> int:
    """Split count: one wave of (split, batch, KV head) programs on the SMs (one program fills an SM), within
    [1, DECODE_MAX_SPLITS] and no split under DECODE_MIN_CHUNK keys."""
    return max(1, min(num_sms // programs, configs.DECODE_MAX_SPLITS, -(-capacity // configs.DECODE_MIN_CHUNK)))


def decode_waves(pairs: int, num_sms: int) -> bool:
    """Whether ``pairs`` (batch, KV head) programs of one split take DECODE_SM90_WAVES: they fill the SMs, and two
    programs an SM do not end on a tail wave of under one program an SM after full waves."""
    tail = pairs % (2 * num_sms)
    return pairs >= num_sms and not (pairs > 2 * num_sms and 0 < tail < num_sms)


def decode_hopper_config(head_dim: int, pairs: int, capacity: int,
                         num_sms: int) -> Optional[configs.DecodeHopperConfig]:
    """The Gluon decode config for ``pairs`` (batch, KV head) programs of one split over caches of ``capacity`` keys
    (DECODE_HOPPER_LONG from DECODE_HOPPER_LONG_FROM keys), or None: at least DECODE_HOPPER_MIN_KEYS keys, and waves of
    the config's programs an SM DECODE_HOPPER_FILL full on average."""
    table = configs.DECODE_HOPPER_LONG if capacity >= configs.DECODE_HOPPER_LONG_FROM else configs.DECODE_HOPPER
    config = table.get(head_dim) if configs.DECODE_BACKEND == "auto" else None
    if config is None or capacity < configs.DECODE_HOPPER_MIN_KEYS:
        return None
    slots = config.per_sm(head_dim) * num_sms
    return config if pairs >= configs.DECODE_HOPPER_FILL * -(-pairs // slots) * slots else None


def decode_heads_config(head_dim_pad: int, nheads_k: int, rows: int, pairs: int, capacity: int,
                        num_sms: int) -> Optional[configs.DecodeConfig]:
    """The several-heads config where its shape applies (the caller checks the cache: contiguous with a key's heads
    side by side, TMA-addressable, not paged), else None: one tile of query rows a head (``rows``: group x new tokens,
    at most 16), ``pairs``: (batch, KV head) programs of one head, ``capacity`` keys of cache."""
    config = configs.DECODE_HEADS_SM90.get(head_dim_pad)
    if config is None or nheads_k % config.heads or rows > 16:
        return None
    chunk, fill = heads_programs(pairs, capacity, num_sms, config.heads)
    return config if fill and chunk >= configs.DECODE_HEADS_FROM else None


def heads_programs(pairs: int, capacity: int, num_sms: int, heads: int) -> tuple[int, bool]:
    """With ``heads`` KV heads a program: (keys a program, whether the programs, one an SM, fill nine tenths of the SMs
    in every wave): a last wave under that runs on few SMs (docs/configs.md#decode_heads_sm90)."""
    programs = pairs // heads
    splits = decode_splits(programs, capacity, num_sms)
    tail = programs * splits % num_sms
    return capacity // splits, programs * splits >= 0.9 * num_sms and (tail == 0 or tail >= 0.9 * num_sms)


def decode_paged_config(head_dim_pad: int, page_size: int, nheads_k: int, rows: int, tma: bool, adjacent: bool,
                        pairs: int, capacity: int, num_sms: int) -> Optional[configs.DecodeConfig]:
    """The paged cache's tiles (None: as the contiguous cache's). ``tma``: the pools are TMA-addressable;
    ``adjacent``: a key's KV heads sit side by side; ``rows``: query rows a head;
    ``pairs``: (batch, KV head) programs of one head. Four KV heads a box where they fit, their programs fill the
    SMs and each gets DECODE_PAGED_HEADS_FROM keys (pages under 64 keys) or DECODE_HEADS_FROM; else one head in
    boxes of 128 or 64 keys; else pointers."""
    tile = next((n for n in (32, 16) if page_size % n == 0), 0)
    heads = configs.DECODE_PAGED_HEADS_SM90.get((head_dim_pad, tile))
    if heads and tma and adjacent and nheads_k % heads.heads == 0 and rows <= 16:
        chunk, fill = heads_programs(pairs, capacity, num_sms, heads.heads)
        if fill and chunk >= (configs.DECODE_PAGED_HEADS_FROM if page_size < 64 else configs.DECODE_HEADS_FROM):
            return heads
    waves = pairs >= num_sms
    tile = next((n for n in (128, 64) if tma and page_size % n == 0), 0)
    return (configs.DECODE_PAGED_SM90_WAVES if waves else configs.DECODE_PAGED_SM90).get((head_dim_pad, tile))


def decode_configs_sm90() -> list[tuple[int, configs.DecodeConfig]]:
    """Every (padded head dim, config) decode_config or decode_heads_config can pick on sm90."""
    plain = [*configs.DECODE_SM90.items(), *configs.DECODE_SM90_WAVES.items()]
    return plain + [(pad, _grouped(pad, c)) for pad, c in plain] + [*configs.DECODE_HEADS_SM90.items()]


def decode_paged_configs_sm90() -> list[tuple[int, int, configs.DecodeConfig]]:
    """Every (padded head dim, keys a TMA box or 0 for pointers, config) decode_paged_config can pick on sm90."""
    tables = (configs.DECODE_PAGED_SM90, configs.DECODE_PAGED_SM90_WAVES, configs.DECODE_PAGED_HEADS_SM90)
    return [(pad, tile, c) for table in tables
            for (pad, tile), c in table.items()]
