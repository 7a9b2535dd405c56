"""flashtile in Hugging Face transformers, through its attention interface.

    import flashtile.integrations.transformers as flashtile_hf
    flashtile_hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=flashtile_hf.NAME)  # or
    model.set_attn_implementation(flashtile_hf.NAME)

Every layer of a model that calls transformers' attention interface then runs on flashtile: ``attention`` takes the
(batch, heads, seqlen, head_dim) tensors transformers passes, and the 2-D padding mask that ``register`` has
transformers build for it (its flash-attention mask: None when nothing is padded). A padded batch, right or left
padded, runs as packed sequences (``unpad`` → flash_attn_varlen_func → ``pad``, flash-attn's bert_padding helpers);
padding-free batches (the
``cu_seq_lens_*`` keyword arguments, or position_ids that restart within one row) run packed as they come; causal
models align their mask bottom-right, so generate()'s cached keys need no mask. GQA, sliding windows and softcap
pass through, and so do attention sinks (gpt-oss's ``s_aux``, as ``learnable_sink``). The name has no
"flash" in it: transformers reads such names as kernels to fetch from its hub.
"""
import torch

from .. import api
from .flash_attn import pad_input as pad
from .flash_attn import unpad_input

NAME = "tile_attention"


def register(name=NAME):
    """Registers ``attention`` and its mask function with transformers under ``name``."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import flash_attention_mask
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def unpad(x, mask):
    """Rows of x (batch, seqlen, ...) where mask (batch, seqlen) is true, packed: (rows (total, ...), indices into the
    flattened (batch · seqlen) rows, int32 cu_seqlens (batch + 1), the longest sequence, as an int: a host sync)."""
    return unpad_input(x, mask)[:4]


_derived = {}  # what the last mask or position ids gave: every layer of a forward sees the same tensor


def _once(tensor, key, derive):
    """derive(tensor), computed once for this tensor (and key) while its contents stay the same: its host syncs are
    paid once a forward, not once a layer."""
    entry = _derived.get(key)
    if entry is None or entry[0] is not tensor or entry[1] != tensor._version:
        entry = (tensor, tensor._version, derive(tensor))
        _derived[key] = entry
    return entry[2]


def _padding(mask, seqlen_q):
    """(key indices, cu_seqlens_k, longest keys, query indices, cu_seqlens_q, longest queries) of a 2-D padding mask;
    the queries are the last seqlen_q keys."""
    def derive(mask):
        mask = mask.bool()
        _, k_index, cu_k, max_k, _ = unpad_input(mask[..., None], mask)
        _, q_index, cu_q, max_q, _ = unpad_input(mask[:, -seqlen_q:, None], mask[:, -seqlen_q:])
        return k_index, cu_k, max_k, q_index, cu_q, max_q
    return _once(mask, ("mask", seqlen_q), derive)


def _packed_from_positions(position_ids):
    """(cu_seqlens (int32), the longest length) of the sequences packed in one row, where position ids restart at 0;
    None if they never restart (one sequence). One host sync, once a forward."""
    def derive(position_ids):
        starts = torch.nonzero(position_ids.flatten() == 0).flatten().tolist()
        if starts in ([], [0]):
            return None
        bounds = sorted({0, *starts, position_ids.numel()})
        return (torch.tensor(bounds, dtype=torch.int32, device=position_ids.device),
                max(b - a for a, b in zip(bounds, bounds[1:])))
    return _once(position_ids, ("positions", ), derive)


def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None, softcap=None,
              is_causal=None, s_aux=None, **kwargs):
    """transformers' attention-function contract: query (batch, heads, seqlen_q, head_dim), key and value (batch,
    kv_heads, seqlen_k, head_dim), attention_mask the 2-D padding mask (batch, seqlen_k) or None, s_aux a sink logit
    per head or None; returns (out (batch, seqlen_q, heads, head_dim), None)."""
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (batch, seqlen, heads, head_dim)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = (-1, -1)
    if sliding_window is not None and k.shape[1] > sliding_window:  # transformers' flash convention
        window = (sliding_window - 1, sliding_window - 1)
    options = dict(dropout_p=dropout, softmax_scale=scaling, causal=causal, window_size=window,
                   softcap=softcap or 0.0, learnable_sink=s_aux)

    batch, seqlen_q = q.shape[:2]
    if attention_mask is not None:
        k_index, cu_k, max_k, q_index, cu_q, max_q = _padding(attention_mask, seqlen_q)
        k_rows, v_rows = (t.reshape(-1, *t.shape[2:])[k_index] for t in (k, v))
        q_rows = q.reshape(-1, *q.shape[2:])[q_index]
        out = api.flash_attn_varlen_func(q_rows, k_rows, v_rows, cu_q, cu_k, max_q, max_k, **options)
        return pad(out, q_index, batch, seqlen_q), None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    packed = None
    if cu_q is not None and cu_k is not None:
        packed = (cu_q.to(torch.int32), cu_k.to(torch.int32), kwargs.get("max_length_q"), kwargs.get("max_length_k"))
    elif batch == 1 and seqlen_q > 1 and kwargs.get("position_ids") is not None:
        found = _packed_from_positions(kwargs["position_ids"])
        if found is not None and seqlen_q == k.shape[1]:
            packed = (found[0], found[0], found[1], found[1])
    if packed is not None:
        cu_q, cu_k, max_q, max_k = packed
        flat = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
        out = api.flash_attn_varlen_func(*flat, cu_q, cu_k, max_q, max_k, **options)
        return out.reshape(batch, seqlen_q, *out.shape[1:]), None
    return api.flash_attn_func(q, k, v, **options), None
