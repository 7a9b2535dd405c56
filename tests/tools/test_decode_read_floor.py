"""tools/decode_read_floor.py: the floor it times must read every key of every head once (a floor that skipped
tiles would be no floor)."""
import sys

import pytest
import torch
from helpers import ROOT

sys.path.insert(0, str(ROOT))
from tools.decode_read_floor import floor_fn  # noqa: E402


@pytest.mark.parametrize("layout", ["key", "head"])
@pytest.mark.parametrize("heads, block_n, boxes", [(1, 16, 1), (4, 8, 1), (8, 4, 1), (8, 4, 8)],
                         ids=lambda v: str(v))
def test_read_floor_reads_every_key(heads, block_n, boxes, layout):
    batch, seqlen, nheads_k, head_dim = 2, 64, 8, 16
    gen = torch.Generator().manual_seed(heads * 10 + boxes)
    k, v = (torch.rand(batch, seqlen, nheads_k, head_dim,
                       generator=gen).half() for _ in range(2))  # fp16: bf16 is wrong in the interpreter
    if layout == "head":  # each head's keys contiguous, seen as (batch, seqlen, nheads_k, head_dim)
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    splits = 16 // (batch * nheads_k // heads)  # 16 programs: 1, 4 or 8 splits, 2-4 tiles each
    programs, chunk = batch * nheads_k // heads * splits, seqlen // splits
    want = torch.empty(programs)
    for p in range(programs):  # a program's one marked element, anywhere in its keys, heads, K or V
        b, g, s = p // splits // (nheads_k // heads), p // splits % (nheads_k // heads), p % splits
        key = s * chunk + int(torch.randint(chunk, (1,), generator=gen))
        head = g * heads + int(torch.randint(heads, (1,), generator=gen))
        d = int(torch.randint(head_dim, (1,), generator=gen))
        want[p] = 2.0 + p
        (v if p % 2 else k)[b, key, head, d] = want[p]
    run, out = floor_fn(k, v, heads, block_n, 1, 4, boxes, 16)
    out.fill_(float("nan"))
    run()
    torch.testing.assert_close(out, want, rtol=0, atol=0)
