"""Context parallelism: one sequence split over the ranks of a torch.distributed group, attention by a ring.

Each rank keeps its shard of Q and passes its K/V shard around the ring: at step s it holds the K/V of rank
(rank − s) mod world, computes its queries' attention against it with the flash kernels (out and LSE of every block
that the causal mask does not wholly cut) and merges the partials exactly by log-sum-exp. The next shard is in
flight (``batch_isend_irecv``) while the current one is computed.

The backward runs the same ring: with the merged out and LSE saved, the backward of one (query block, key block)
pair is the ordinary FlashAttention backward of that pair (P = exp(S − LSE) with the global LSE, delta = rowsum(dO ∘ O)
with the global O), so dQ sums over the steps on its own rank and each K/V shard's dK, dV travel around the ring with
it, back to their owner after ``world`` steps.

Layouts of the sequence over the ranks (``layout``):
- ``contiguous``: rank r holds positions [r·L, (r + 1)·L);
- ``zigzag``: the sequence in 2·world equal chunks, rank r holds chunks r and 2·world − 1 − r, so that under a causal
  mask every rank has the same work.
"""
import math

import torch
import torch.distributed as dist

from . import checks, ops

LAYOUTS = ("contiguous", "zigzag")


def ring_attention(q, k, v, causal=False, softmax_scale=None, group=None, layout="zigzag"):
    """This rank's output shard (batch, seqlen_local, nheads, headdim) of attention over the whole sequence, whose
    shards q, k, v (batch, seqlen_local, nheads[_k], headdim) the ranks of ``group`` (default: the world) hold in
    ``layout`` order. Differentiable in q, k, v; GQA; fp16/bf16 (float32 exact, as flash_attn_func)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    checks.qkv(q, k, v, packed=False)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"q and k must hold shards of one length: q has {q.shape[1]} rows, k {k.shape[1]}")
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"layout='zigzag' needs an even seqlen_local (two chunks a rank), not {q.shape[1]}")
    if not dist.is_initialized():
        raise RuntimeError("ring_attention needs torch.distributed initialized (dist.init_process_group)")
    head_dim = q.shape[-1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    group = group if group is not None else dist.group.WORLD
    q, k, v = ops.pad_head_dim(q, k, v)
    return _Ring.apply(q, k, v, causal, scale, group, layout)[..., :head_dim]


def _chunks(rank, world, seqlen, layout):
    """[(global chunk index, local slice)] of a rank's shard; chunks of one layout have one length."""
    if layout == "contiguous":
        return [(rank, slice(0, seqlen))]
    half = seqlen // 2
    return [(rank, slice(0, half)), (2 * world - 1 - rank, slice(half, seqlen))]


def _pairs(rank, src, world, seqlen, layout, causal):
    """(query slice, key slice, window) of every block pair of this rank's queries against rank src's keys that
    contributes: under a causal mask a key chunk after the query chunk gives nothing, the same chunk its diagonal
    (equal lengths), an earlier one everything."""
    if not causal:
        return [(slice(0, seqlen), slice(0, seqlen), (-1, -1))]
    pairs = []
    for i, q_slice in _chunks(rank, world, seqlen, layout):
        for j, k_slice in _chunks(src, world, seqlen, layout):
            if j < i:
                pairs.append((q_slice, k_slice, (-1, -1)))
            elif j == i:
                pairs.append((q_slice, k_slice, (-1, 0)))
    return pairs


class _Shift:
    """Send tensors to the next rank of the ring and receive the previous rank's, asynchronously."""

    def __init__(self, group):
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world)

    def start(self, tensor):
        received = torch.empty_like(tensor)
        ops_ = [dist.P2POp(dist.isend, tensor, self.next, self.group),
                dist.P2POp(dist.irecv, received, self.prev, self.group)]
        return received, dist.batch_isend_irecv(ops_)

    @staticmethod
    def finish(pending):
        received, requests = pending
        for request in requests:
            request.wait()
        return received


def _merge(out, lse, part_out, part_lse):
    """out, lse (float32 running merge) with one more partial: rows where both LSEs are -inf stay empty."""
    new = torch.logaddexp(lse, part_lse)
    empty = torch.isneginf(new)
    keep = torch.where(empty, 0.0, torch.exp(lse - new)).transpose(1, 2)[..., None]  # [batch, seqlen, heads, 1]
    take = torch.where(empty, 0.0, torch.exp(part_lse - new)).transpose(1, 2)[..., None]
    return out * keep + part_out.float() * take, new


class _Ring(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, group, layout):
        shift = _Shift(group)
        rank, world, seqlen = shift.rank, shift.world, q.shape[1]
        batch, _, nheads, _ = q.shape
        out = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        lse = torch.full((batch, nheads, seqlen), float("-inf"), device=q.device)
        kv = torch.stack((k, v)).contiguous()
        for step in range(world):
            pending = shift.start(kv) if step + 1 < world else None  # the next shard travels meanwhile
            src = (rank - step) % world
            for q_slice, k_slice, window in _pairs(rank, src, world, seqlen, layout, causal):
                part_out, part_lse = ops.attention_forward(q[:, q_slice].contiguous(),
                                                           kv[0][:, k_slice].contiguous(),
                                                           kv[1][:, k_slice].contiguous(), scale, window, True)
                out[:, q_slice], lse[:, :, q_slice] = _merge(out[:, q_slice], lse[:, :, q_slice], part_out,
                                                             part_lse)
            if pending is not None:
                kv = _Shift.finish(pending)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.group, ctx.layout = causal, scale, group, layout
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        shift = _Shift(ctx.group)
        rank, world, seqlen = shift.rank, shift.world, q.shape[1]
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        kv = torch.stack((k, v)).contiguous()
        dkv = torch.zeros(kv.shape, device=q.device, dtype=torch.float32)  # grads of the shard now held
        for step in range(world):
            pending = shift.start(kv) if step + 1 < world else None
            src = (rank - step) % world
            for q_slice, k_slice, window in _pairs(rank, src, world, seqlen, ctx.layout, ctx.causal):
                dq_part, dk_part, dv_part = ops.attention_backward(
                    *(t[:, q_slice].contiguous() for t in (dout, q)), *(t[:, k_slice].contiguous() for t in kv),
                    out[:, q_slice].contiguous(), lse[:, :, q_slice].contiguous(), ctx.scale, window, True, False)
                dq[:, q_slice] += dq_part
                dkv[0][:, k_slice] += dk_part
                dkv[1][:, k_slice] += dv_part
            dkv = _Shift.finish(shift.start(dkv))  # on to the next rank, with the shard it belongs to
            if pending is not None:
                kv = _Shift.finish(pending)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None
