"""flashtile.distributed.ring_attention over 2 and 4 processes: gloo under the Triton interpreter on the CPU tier,
NCCL with a GPU a rank where there are enough of them. Each rank's output and dQ, dK, dV shards, put back in sequence
order, against one process's flash_attn_func on the whole tensors and the float64 reference, within 2x of PyTorch's
own error."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import DEVICE

import flashtile
from flashtile import reference

CASES = [(layout, causal, nheads_k) for layout in ("contiguous", "zigzag") for causal in (False, True)
         for nheads_k in (4, 1)]  # MHA and MQA over 4 query heads
BATCH, NHEADS, HEAD_DIM, ROWS_PER_CHUNK = 2, 4, 24, 5  # head dim 24: padded inside; chunks of 5 rows
BACKEND = "gloo" if DEVICE == "cpu" else "nccl"


def positions(rank, world, seqlen, layout):
    """The global rows rank ``rank`` holds, in its shard's order."""
    if layout == "contiguous":
        step = seqlen // world
        return torch.arange(rank * step, (rank + 1) * step)
    chunk = seqlen // (2 * world)
    first, second = rank, 2 * world - 1 - rank
    return torch.cat([torch.arange(first * chunk, (first + 1) * chunk), torch.arange(second * chunk,
                                                                                      (second + 1) * chunk)])


def inputs(case_index, world, nheads_k):
    generator = torch.Generator().manual_seed(case_index)
    seqlen = 2 * world * ROWS_PER_CHUNK
    shapes = [(BATCH, seqlen, NHEADS, HEAD_DIM), (BATCH, seqlen, nheads_k, HEAD_DIM),
              (BATCH, seqlen, nheads_k, HEAD_DIM), (BATCH, seqlen, NHEADS, HEAD_DIM)]
    return [torch.randn(*s, generator=generator).half().to(DEVICE) for s in shapes]


def _worker(rank, world, init_file, out_dir):
    if BACKEND == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(BACKEND, init_method=f"file://{init_file}", rank=rank, world_size=world)
    from flashtile.distributed import ring_attention
    for index, (layout, causal, nheads_k) in enumerate(CASES):
        q, k, v, dout = inputs(index, world, nheads_k)
        rows = positions(rank, world, q.shape[1], layout)
        shards = [t[:, rows].clone().requires_grad_() for t in (q, k, v)]
        out = ring_attention(*shards, causal=causal, layout=layout)
        grads = torch.autograd.grad(out, shards, dout[:, rows])
        torch.save([t.cpu() for t in (out.detach(), *grads)], os.path.join(out_dir, f"{index}-{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_matches_one_process(world, tmp_path):
    if BACKEND == "nccl" and torch.cuda.device_count() < world:
        pytest.skip(f"NCCL with {world} ranks needs {world} GPUs")
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world, join=True)
    for index, (layout, causal, nheads_k) in enumerate(CASES):
        q, k, v, dout = inputs(index, world, nheads_k)
        got = [torch.empty_like(t) for t in (q, q, k, v)]  # out, dq, dk, dv in sequence order
        for rank in range(world):
            rows = positions(rank, world, q.shape[1], layout)
            for whole, shard in zip(got, torch.load(tmp_path / f"{index}-{rank}.pt")):
                whole[:, rows] = shard.to(DEVICE)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        one = flashtile.flash_attn_func(*leaves, causal=causal)
        single = [one.detach(), *torch.autograd.grad(one, leaves, dout)]
        exact = [t.double().requires_grad_() for t in (q, k, v)]
        ref_out, _ = reference.attention(*exact, causal=causal)
        ref = [ref_out.detach(), *torch.autograd.grad(ref_out, exact, dout.double())]
        plain = [t.clone().requires_grad_() for t in (q, k, v)]
        base_out, _ = reference.attention(*plain, causal=causal, upcast=False)
        base = [base_out.detach(), *torch.autograd.grad(base_out, plain, dout)]
        for name, g, s, r, b in zip(("out", "dq", "dk", "dv"), got, single, ref, base):
            assert torch.isfinite(g).all(), (layout, causal, nheads_k, name)
            err, base_err = (g.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
            assert err <= 2 * base_err + 2e-3, (layout, causal, nheads_k, name, err, base_err)
            assert (g.double() - s.double()).abs().max().item() <= 2 * base_err + 2e-3, (layout, causal, name)


def test_ring_attention_refuses_bad_arguments():
    from flashtile.distributed import ring_attention
    q = torch.randn(1, 6, 2, 16, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="layout"):
        ring_attention(q, q, q, layout="striped")
    with pytest.raises(ValueError, match="even seqlen_local"):
        ring_attention(q[:, :5], q[:, :5], q[:, :5])
    with pytest.raises(ValueError, match="one length"):
        ring_attention(q, q[:, :4], q[:, :4], layout="contiguous")
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            ring_attention(q, q, q)
