"""The warp-specialized Gluon decode kernel (kernels/hopper/decode.py) against the shipped dispatch, the same held to
the portable kernel, and SDPA's cuDNN, in paired turns (decode_paired.paired_rows), over caches of both layouts. Each
Gluon config is first checked against a float32 reference on ragged lengths with NaN past each one (O and LSE).

    PYTHONPATH=. python scripts/decode_ws_probe.py [--shapes 32 32768 32 131072] [--turns 12] [--layouts head key]
        [--configs block_n stages consumer_regs maxnreg ...]
"""
import argparse
import functools

import torch

from flashtile import configs
from flashtile.bench.decode import peers
from flashtile.configs import DecodeHopperConfig, from_fields
from flashtile.kernels.hopper.decode import launch_decode_hopper, supports
from tools.decode_paired import HEADER, paired_rows
from tools.decode_read_floor import cache


def portable(fn):
    """fn with the dispatch held to the portable decode kernel (configs.DECODE_BACKEND)."""
    def run():
        configs.DECODE_BACKEND = "portable"
        try:
            return fn()
        finally:
            configs.DECODE_BACKEND = "auto"
    return run


def hopper_fn(q, kc, vc, seqlens, config):
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
    return functools.partial(_run, q, kc, vc, seqlens, out, lse, config)


def _run(q, kc, vc, seqlens, out, lse, config):
    launch_decode_hopper(q, kc, vc, seqlens, out, lse, q.shape[-1] ** -0.5, config)
    return out, lse


def check(q, kc, vc, seqlens, config):
    """Largest |O - reference| and |LSE - reference| on ragged lengths (0, 1, a tile and one, the full cache...)
    with NaN in the cache past every length, and the same for cuDNN's O on the full cache."""
    batch, seqlen = kc.shape[0], kc.shape[1]
    lens = torch.randint(0, seqlen + 1, (batch,), device=q.device, dtype=torch.int32)
    lens[:4] = torch.tensor([0, 1, config.block_n + 1, seqlen], dtype=torch.int32)[:batch]
    kn, vn = kc.clone(), vc.clone()
    for b, n in enumerate(lens.tolist()):
        kn[b, n:] = float("nan")
        vn[b, n:] = float("nan")
    out, lse = _run(q, kn, vn, lens, torch.full_like(q, float("nan")),
                    torch.full((batch, q.shape[2], 1), float("nan"), device=q.device), config)
    errs_o, errs_l = [], []
    for b, n in enumerate(lens.tolist()):
        qb = q[b, 0].float().view(8, -1, q.shape[-1])  # [KV heads, group, D]
        s = torch.einsum("hgd,nhd->hgn", qb, kc[b, :n].float()) * q.shape[-1] ** -0.5
        ref_lse = torch.logsumexp(s, -1) if n else torch.full(s.shape[:2], float("-inf"), device=q.device)
        ref = (torch.einsum("hgn,nhd->hgd", torch.softmax(s, -1), vc[b, :n].float()) if n
               else torch.zeros_like(qb))
        errs_o.append((out[b, 0].float().view_as(ref) - ref).abs().max().item())
        got_lse = lse[b, :, 0].view_as(ref_lse)
        errs_l.append(0.0 if n == 0 and bool((got_lse == float("-inf")).all()) else
                      (got_lse - ref_lse).abs().max().item())
    return max(errs_o), max(errs_l)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", type=int, nargs="+", default=[32, 32768, 32, 131072], help="B L, flat")
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--layouts", nargs="+", default=["head", "key"], choices=["head", "key"])
    parser.add_argument("--configs", type=int, nargs="*", default=[64, 2, 168, 128])
    args = parser.parse_args()
    configs = [from_fields(DecodeHopperConfig, c) for c in zip(*[iter(args.configs)] * 4)]
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}: {args.turns} turns; Gluon configs "
          "block_n/stages/consumer_regs/maxnreg\n")
    print(HEADER)
    for layout in args.layouts:
        for batch, seqlen in zip(args.shapes[::2], args.shapes[1::2]):
            fns = peers(batch, seqlen, layout=layout)
            fns = {"flashtile": fns["flashtile"], "cuDNN": fns["cuDNN"], "portable": portable(fns["flashtile"])}
            q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
            kc, vc = cache(batch, seqlen, layout), cache(batch, seqlen, layout)
            assert supports(q, kc, vc)
            seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
            for c in configs:
                err_o, err_l = check(q, kc, vc, seqlens, c)
                name = "gluon " + "/".join(map(str, c.__dict__.values()))
                print(f"  {layout} B={batch} L={seqlen} {name}: max |O - ref| {err_o:.1e}, |LSE - ref| {err_l:.1e}",
                      flush=True)
                fns[name] = hopper_fn(q, kc, vc, seqlens, c)
            paired_rows(f"| {layout} | {batch} | {seqlen} |", fns, args.turns)
            del fns, q, kc, vc
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
