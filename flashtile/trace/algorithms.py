"""Each lesson algorithm, tile by tile, on small float64 NumPy arrays: every tile moved between HBM and
SRAM is a step of the returned Trace, with the kernel line it carries out."""
import math

import numpy as np

from .core import Trace

NAIVE_CODE = [
    "for each tile (i, j): load Q_i, K_j;  S_ij = Q_i K_jᵀ · scale;  store S_ij",
    "for each row block i: load S_i (whole rows);  P_i = softmax(S_i) (causal: future = 0);  store P_i",
    "for each row block i: for each j: load P_ij, V_j;  O_i += P_ij V_j",
    "    store O_i",
]
SOFTMAX_CODE = [
    "for each row block i:",
    "    m = −inf, d = 0",
    "    for each tile j: load x_ij",
    "        m_new = max(m, rowmax(x_ij));  d = d·exp(m − m_new) + rowsum(exp(x_ij − m_new));  m = m_new",
    "    for each tile j: load x_ij again",
    "        y_ij = exp(x_ij − m) / d;  store y_ij",
]
FA1_CODE = [
    "for each K/V tile j (outer loop):",
    "    load K_j, V_j",
    "    for each Q tile i (inner loop; causal: skip tiles wholly in the future):",
    "        load Q_i, O_i, m_i, l_i",
    "        S = Q_i K_jᵀ · scale (mask the diagonal tile);  m_new = max(m_i, rowmax(S));  P = exp(S − m_new)",
    "        l_new = l_i·exp(m_i − m_new) + rowsum(P);  O_i = (l_i·exp(m_i − m_new)·O_i + P V_j) / l_new",
    "        store O_i, m_i = m_new, l_i = l_new",
]
FA2_CODE = [
    "for each Q tile i (outer loop: one program each):",
    "    load Q_i;  m = −inf, l = 0, acc = 0 (in registers)",
    "    for each K/V tile j (causal: only up to the diagonal):",
    "        load K_j, V_j",
    "        S = Q_i K_jᵀ · scale (mask the diagonal tile);  m_new = max(m, rowmax(S));  P = exp(S − m_new)",
    "        l = l·exp(m − m_new) + rowsum(P);  acc = acc·exp(m − m_new) + P V_j;  m = m_new",
    "    O_i = acc / l;  store O_i and LSE_i = m + log l (once)",
]
FA2_BWD_CODE = [
    "preprocess, for each Q tile i: load O_i, dO_i;  D_i = rowsum(dO_i ∘ O_i);  store D_i",
    "for each K/V tile j (one program each):",
    "    load K_j, V_j;  dK = 0, dV = 0 (in registers)",
    "    for each Q tile i (causal: only tiles that see K_j):",
    "        load Q_i, dO_i, LSE_i, D_i",
    "        S = Q_i K_jᵀ · scale (mask the diagonal tile);  P = exp(S − LSE_i)  (recomputed, never stored)",
    "        dV += Pᵀ dO_i;  dP = dO_i V_jᵀ;  dS = P ∘ (dP − D_i)",
    "        dK += dSᵀ Q_i · scale",
    "        dQ_i += dS K_j · scale  (read and write dQ_i in HBM: other programs add to it too)",
    "    store dK_j, dV_j (once)",
]
DECODE_CODE = [
    "for each split s of the KV cache (one program each, in parallel):",
    "    load q;  m = −inf, l = 0, acc = 0",
    "    for each K/V tile j of split s: load K_j, V_j",
    "        S = q K_jᵀ · scale;  online-softmax update of m, l, acc",
    "    store O_s = acc / l and LSE_s = m + log l",
    "combine: load every O_s, LSE_s",
    "    LSE = log Σ_s exp(LSE_s);  O = Σ_s exp(LSE_s − LSE) · O_s;  store O",
]


def _inputs(seqlen, head_dim, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((seqlen, head_dim)), rng.standard_normal((seqlen, head_dim)),
            rng.standard_normal((seqlen, head_dim)))


def _blocks(n, size):
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def _future(i0, i1, j0, causal):
    """A tile whose first key lies after its last query (top-left causal, square): nothing to see."""
    return causal and j0 > i1 - 1


def _mask(s, i0, j0, causal):
    if causal:
        rows = np.arange(i0, i0 + s.shape[0])[:, None]
        cols = np.arange(j0, j0 + s.shape[1])[None, :]
        s = np.where(cols > rows, -np.inf, s)
    return s


def naive(seqlen, head_dim, block_m, block_n, causal, seed, itemsize):
    q, k, v = _inputs(seqlen, head_dim, seed)
    t = Trace("naive", NAIVE_CODE, dict(Q=(seqlen, head_dim), K=(seqlen, head_dim), V=(seqlen, head_dim),
                                        S=(seqlen, seqlen), P=(seqlen, seqlen), O=(seqlen, head_dim)),
              dict(Q=(block_m, head_dim), K=(block_n, head_dim), V=(block_n, head_dim), S=(block_m, block_n),
                   P=(block_m, block_n), O=(block_m, head_dim)), itemsize)
    scale = 1 / math.sqrt(head_dim)
    s_full = np.zeros((seqlen, seqlen))
    rows, cols = _blocks(seqlen, block_m), _blocks(seqlen, block_n)
    for bi, (i0, i1) in enumerate(rows):
        for bj, (j0, j1) in enumerate(cols):
            t.begin(f"S tile ({bi},{bj})")
            t.load("Q", (bi, 0), i1 - i0, head_dim, f"Load Q tile {bi} for S tile ({bi},{bj}).", 0)
            t.load("K", (bj, 0), j1 - j0, head_dim, f"Load K tile {bj}.", 0)
            s_full[i0:i1, j0:j1] = q[i0:i1] @ k[j0:j1].T * scale
            t.store("S", (bi, bj), i1 - i0, j1 - j0, f"S tile ({bi},{bj}) goes back to HBM: N×N scores live there.", 0)
    p_full = np.zeros_like(s_full)
    for bi, (i0, i1) in enumerate(rows):
        t.begin(f"softmax of row block {bi}")
        for bj, (j0, j1) in enumerate(cols):
            t.load("S", (bi, bj), i1 - i0, j1 - j0, f"Read S tile ({bi},{bj}) back for the softmax.", 1)
        s = _mask(s_full[i0:i1], i0, 0, causal)
        p = np.exp(s - s.max(1, keepdims=True))
        p_full[i0:i1] = p / p.sum(1, keepdims=True)
        for bj, (j0, j1) in enumerate(cols):
            t.store("P", (bi, bj), i1 - i0, j1 - j0, f"Write P tile ({bi},{bj}): a second N×N matrix.", 1)
    out = np.zeros((seqlen, head_dim))
    for bi, (i0, i1) in enumerate(rows):
        t.begin(f"P V for row block {bi}")
        for bj, (j0, j1) in enumerate(cols):
            t.load("P", (bi, bj), i1 - i0, j1 - j0, f"Read P tile ({bi},{bj}).", 2)
            t.load("V", (bj, 0), j1 - j0, head_dim, f"Read V tile {bj}.", 2)
            out[i0:i1] += p_full[i0:i1, j0:j1] @ v[j0:j1]
        t.store("O", (bi, 0), i1 - i0, head_dim, f"Write O tile {bi}.", 3, O=out[i0:i1])
    t.result = dict(q=q, k=k, v=v, out=out)
    return t


def softmax(seqlen, head_dim, block_m, block_n, causal, seed, itemsize):
    """Online softmax of the rows of an N×N score matrix x: two reads of x, one write of y."""
    rng = np.random.default_rng(seed)
    x = _mask(rng.standard_normal((seqlen, seqlen)) * 3, 0, 0, causal)
    t = Trace("softmax", SOFTMAX_CODE, dict(x=(seqlen, seqlen), y=(seqlen, seqlen)),
              dict(x=(block_m, block_n), y=(block_m, block_n)), itemsize)
    y = np.zeros_like(x)
    for bi, (i0, i1) in enumerate(_blocks(seqlen, block_m)):
        m, d = np.full(i1 - i0, -np.inf), np.zeros(i1 - i0)
        t.begin(f"row block {bi}")
        t.compute(f"Row block {bi}: running max m = −inf, denominator d = 0.", 1, m=m, d=d)
        for bj, (j0, j1) in enumerate(_blocks(seqlen, block_n)):
            t.load("x", (bi, bj), i1 - i0, j1 - j0, f"Pass 1: load x tile ({bi},{bj}).", 2)
            tile = x[i0:i1, j0:j1]
            m_new = np.maximum(m, tile.max(1))
            d = d * np.exp(m - m_new) + np.exp(tile - m_new[:, None]).sum(1)
            m = m_new
            t.compute("Fold the tile in: a larger max rescales the old denominator by exp(m − m_new).", 3, m=m, d=d)
        for bj, (j0, j1) in enumerate(_blocks(seqlen, block_n)):
            t.load("x", (bi, bj), i1 - i0, j1 - j0, f"Pass 2: load x tile ({bi},{bj}) again.", 4)
            y[i0:i1, j0:j1] = np.exp(x[i0:i1, j0:j1] - m[:, None]) / d[:, None]
            t.store("y", (bi, bj), i1 - i0, j1 - j0, f"Store the normalized tile y ({bi},{bj}).", 5)
    t.result = dict(x=x, y=y)
    return t


def _tile_step(q_i, k_j, v_j, m, l, acc, i0, j0, scale, causal):
    """One online-softmax step of a Q tile against a K/V tile (acc unnormalized)."""
    s = _mask(q_i @ k_j.T * scale, i0, j0, causal)
    m_new = np.maximum(m, s.max(1))
    m_ref = np.where(np.isinf(m_new), 0.0, m_new)
    p = np.exp(s - m_ref[:, None])
    alpha = np.exp(m - m_ref)
    return m_new, l * alpha + p.sum(1), acc * alpha[:, None] + p @ v_j


def fa1(seqlen, head_dim, block_m, block_n, causal, seed, itemsize):
    q, k, v = _inputs(seqlen, head_dim, seed)
    t = Trace("fa1", FA1_CODE, dict(Q=(seqlen, head_dim), K=(seqlen, head_dim), V=(seqlen, head_dim),
                                    O=(seqlen, head_dim), m=(seqlen, 1), l=(seqlen, 1)),
              dict(Q=(block_m, head_dim), K=(block_n, head_dim), V=(block_n, head_dim), O=(block_m, head_dim),
                   m=(block_m, 1), l=(block_m, 1)), itemsize)
    scale = 1 / math.sqrt(head_dim)
    out, m_hbm, l_hbm = np.zeros((seqlen, head_dim)), np.full(seqlen, -np.inf), np.zeros(seqlen)
    for bj, (j0, j1) in enumerate(_blocks(seqlen, block_n)):
        t.begin(f"outer step {bj} (K/V tile {bj})")
        t.load("K", (bj, 0), j1 - j0, head_dim, f"Outer step {bj}: load K tile {bj} once.", 1)
        t.load("V", (bj, 0), j1 - j0, head_dim, f"Load V tile {bj} once.", 1)
        for bi, (i0, i1) in enumerate(_blocks(seqlen, block_m)):
            if _future(i0, i1, j0, causal):
                t.skip((bi, bj), f"Q tile {bi} cannot see K tile {bj} (causal): that work is skipped.", 2)
                continue
            rows = i1 - i0
            for name, cols in (("Q", head_dim), ("O", head_dim), ("m", 1), ("l", 1)):
                t.load(name, (bi, 0), rows, cols, f"Inner step: load {name} tile {bi} from HBM.", 3)
            m, l, o = m_hbm[i0:i1], l_hbm[i0:i1], out[i0:i1]
            m_new, l_new, acc = _tile_step(q[i0:i1], k[j0:j1], v[j0:j1], m, l, o * l[:, None], i0, j0, scale, causal)
            out[i0:i1] = acc / np.where(l_new == 0, 1, l_new)[:, None]
            m_hbm[i0:i1], l_hbm[i0:i1] = m_new, l_new
            t.compute("Rescale the stored O by its old denominator, add P·V_j, renormalize.", 5, (bi, bj), m=m_new,
                      l=l_new, O=out[i0:i1])
            for name, cols in (("O", head_dim), ("m", 1), ("l", 1)):
                t.store(name, (bi, 0), rows, cols, f"Write {name} tile {bi} back: the next outer step reads it.", 6)
    lse = np.where(l_hbm > 0, m_hbm + np.log(np.where(l_hbm > 0, l_hbm, 1)), -np.inf)
    t.result = dict(q=q, k=k, v=v, out=out, lse=lse)
    return t


def fa2(seqlen, head_dim, block_m, block_n, causal, seed, itemsize):
    q, k, v = _inputs(seqlen, head_dim, seed)
    t = Trace("fa2", FA2_CODE, dict(Q=(seqlen, head_dim), K=(seqlen, head_dim), V=(seqlen, head_dim),
                                    O=(seqlen, head_dim), LSE=(seqlen, 1)),
              dict(Q=(block_m, head_dim), K=(block_n, head_dim), V=(block_n, head_dim), O=(block_m, head_dim),
                   LSE=(block_m, 1)), itemsize)
    scale = 1 / math.sqrt(head_dim)
    out, lse = np.zeros((seqlen, head_dim)), np.zeros(seqlen)
    for bi, (i0, i1) in enumerate(_blocks(seqlen, block_m)):
        rows = i1 - i0
        t.begin(f"program {bi} (Q tile {bi})")
        t.load("Q", (bi, 0), rows, head_dim, f"Program {bi}: load Q tile {bi} once; m, l, acc start in registers.", 1)
        m, l, acc = np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, head_dim))
        for bj, (j0, j1) in enumerate(_blocks(seqlen, block_n)):
            if _future(i0, i1, j0, causal):
                t.skip((bi, bj), f"K/V tile {bj} lies wholly in Q tile {bi}'s future: never loaded.", 2)
                continue
            t.load("K", (bj, 0), j1 - j0, head_dim, f"Load K tile {bj}.", 3)
            t.load("V", (bj, 0), j1 - j0, head_dim, f"Load V tile {bj}.", 3)
            m, l, acc = _tile_step(q[i0:i1], k[j0:j1], v[j0:j1], m, l, acc, i0, j0, scale, causal)
            t.compute("Online softmax: rescale acc and l by exp(m − m_new), add this tile.", 5, (bi, bj), m=m, l=l)
        out[i0:i1] = acc / np.where(l == 0, 1, l)[:, None]
        lse[i0:i1] = np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf)
        t.store("O", (bi, 0), rows, head_dim, f"Normalize once and store O tile {bi}: its only write.", 6,
                O=out[i0:i1])
        t.store("LSE", (bi, 0), rows, 1, f"Store the row log-sum-exp of tile {bi} for the backward pass.", 6)
    t.result = dict(q=q, k=k, v=v, out=out, lse=lse)
    return t


def fa2_bwd(seqlen, head_dim, block_m, block_n, causal, seed, itemsize):
    """The FlashAttention-2 backward: K/V-tile programs over the Q tiles that see them, P recomputed from the
    forward's LSE, dK and dV in registers, dQ added into HBM."""
    q, k, v = _inputs(seqlen, head_dim, seed)
    dout = np.random.default_rng(seed + 1).standard_normal((seqlen, head_dim))
    shapes = {name: (seqlen, head_dim) for name in ("Q", "K", "V", "O", "dO", "dQ", "dK", "dV")}
    shapes.update(LSE=(seqlen, 1), D=(seqlen, 1))
    tiles = {name: ((block_n if name in ("K", "V", "dK", "dV") else block_m), head_dim) for name in shapes}
    tiles.update(LSE=(block_m, 1), D=(block_m, 1))
    t = Trace("fa2_bwd", FA2_BWD_CODE, shapes, tiles, itemsize)
    scale = 1 / math.sqrt(head_dim)
    s_full = _mask(q @ k.T * scale, 0, 0, causal)  # the forward's result, as the backward finds it in HBM
    lse = np.log(np.exp(s_full - s_full.max(1, keepdims=True)).sum(1)) + s_full.max(1)
    out = np.exp(s_full - lse[:, None]) @ v
    rows = _blocks(seqlen, block_m)
    delta = np.zeros(seqlen)
    for bi, (i0, i1) in enumerate(rows):
        t.begin(f"preprocess, Q tile {bi}")
        t.load("O", (bi, 0), i1 - i0, head_dim, f"Preprocess: load O tile {bi}.", 0)
        t.load("dO", (bi, 0), i1 - i0, head_dim, f"Preprocess: load dO tile {bi}.", 0)
        delta[i0:i1] = (dout[i0:i1] * out[i0:i1]).sum(1)
        t.store("D", (bi, 0), i1 - i0, 1, f"Store D = rowsum(dO ∘ O) of tile {bi}: one float a row.", 0,
                D=delta[i0:i1])
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for bj, (j0, j1) in enumerate(_blocks(seqlen, block_n)):
        cols = j1 - j0
        t.begin(f"program {bj} (K/V tile {bj})")
        t.load("K", (bj, 0), cols, head_dim, f"Program {bj}: load K tile {bj} once.", 2)
        t.load("V", (bj, 0), cols, head_dim, f"Load V tile {bj} once; dK, dV start at 0 in registers.", 2)
        for bi, (i0, i1) in enumerate(rows):
            if _future(i0, i1, j0, causal):
                t.skip((bi, bj), f"Q tile {bi} cannot see K tile {bj} (causal): its work is skipped.", 3)
                continue
            r = i1 - i0
            for name, width in (("Q", head_dim), ("dO", head_dim), ("LSE", 1), ("D", 1)):
                t.load(name, (bi, 0), r, width, f"Load {name} tile {bi}.", 4)
            p = np.exp(_mask(q[i0:i1] @ k[j0:j1].T * scale, i0, j0, causal) - lse[i0:i1, None])  # [r, cols]
            t.compute("Recompute P from Q, K and the saved LSE: the N×N probabilities never reach HBM.", 5, (bi, bj))
            dv[j0:j1] += p.T @ dout[i0:i1]
            ds = p * (dout[i0:i1] @ v[j0:j1].T - delta[i0:i1, None])
            t.compute("dV += Pᵀ dO;  dS = P ∘ (dO Vᵀ − D).", 6)
            dk[j0:j1] += ds.T @ q[i0:i1] * scale
            t.compute("dK += dSᵀ Q · scale, still in registers.", 7, dK=dk[j0:j1])
            t.load("dQ", (bi, 0), r, head_dim, f"Read dQ tile {bi}: every program that sees it adds to it.", 8)
            dq[i0:i1] += ds @ k[j0:j1] * scale
            t.store("dQ", (bi, 0), r, head_dim, f"Write dQ tile {bi} back (on a GPU: an atomic add).", 8,
                    dQ=dq[i0:i1])
        t.store("dK", (bj, 0), cols, head_dim, f"Store dK tile {bj}: its only write.", 9, dK=dk[j0:j1])
        t.store("dV", (bj, 0), cols, head_dim, f"Store dV tile {bj}: its only write.", 9)
    t.result = dict(q=q, k=k, v=v, dout=dout, out=out, lse=lse, dq=dq, dk=dk, dv=dv)
    return t


def decode(seqlen, head_dim, block_m, block_n, causal, seed, itemsize, splits=None):
    """One query token over a cache of ``seqlen`` keys split into chunks of whole K/V tiles."""
    _, k, v = _inputs(seqlen, head_dim, seed)
    q = np.random.default_rng(seed + 1).standard_normal((1, head_dim))
    tiles = _blocks(seqlen, block_n)
    splits = splits or max(1, len(tiles) // 2)
    per_split = math.ceil(len(tiles) / splits)
    chunks = [tiles[s * per_split:(s + 1) * per_split] for s in range(splits)]
    t = Trace("decode", DECODE_CODE, dict(q=(1, head_dim), K=(seqlen, head_dim), V=(seqlen, head_dim),
                                          O_part=(splits, head_dim), LSE_part=(splits, 1), O=(1, head_dim)),
              dict(q=(1, head_dim), K=(block_n, head_dim), V=(block_n, head_dim), O_part=(1, head_dim),
                   LSE_part=(1, 1), O=(1, head_dim)), itemsize)
    scale = 1 / math.sqrt(head_dim)
    parts, lses = np.zeros((splits, head_dim)), np.full(splits, -np.inf)
    for s, chunk in enumerate(chunks):
        t.begin(f"split {s}")
        t.load("q", (0, 0), 1, head_dim, f"Split {s}: load the query.", 1)
        m, l, acc = np.full(1, -np.inf), np.zeros(1), np.zeros((1, head_dim))
        for j0, j1 in chunk:
            bj = j0 // block_n
            t.load("K", (bj, 0), j1 - j0, head_dim, f"Split {s}: load K tile {bj}.", 2)
            t.load("V", (bj, 0), j1 - j0, head_dim, f"Split {s}: load V tile {bj}.", 2)
            m, l, acc = _tile_step(q, k[j0:j1], v[j0:j1], m, l, acc, 0, j0, scale, False)
            t.compute("Online-softmax update within the split.", 3, m=m, l=l)
        if l[0] > 0:
            parts[s], lses[s] = acc[0] / l[0], m[0] + math.log(l[0])
        t.store("O_part", (s, 0), 1, head_dim, f"Split {s}: store its partial output.", 4, O=parts[s])
        t.store("LSE_part", (s, 0), 1, 1, f"Split {s}: store its log-sum-exp {lses[s]:.3f}.", 4)
    t.begin("combine")
    for s in range(splits):
        t.load("O_part", (s, 0), 1, head_dim, f"Combine: load partial {s}.", 5)
        t.load("LSE_part", (s, 0), 1, 1, f"Combine: load LSE {s}.", 5)
    finite = np.isfinite(lses)
    lse = np.log(np.exp(lses[finite] - lses[finite].max()).sum()) + lses[finite].max() if finite.any() else -np.inf
    weights = np.where(finite, np.exp(lses - lse), 0.0)
    out = (weights[:, None] * parts).sum(0, keepdims=True)
    t.store("O", (0, 0), 1, head_dim, "Weight each partial by exp(LSE_s − LSE) and store O once.", 6, O=out[0])
    t.result = dict(q=q, k=k, v=v, out=out, lse=np.array([lse]))
    return t


ALGORITHMS = dict(naive=naive, softmax=softmax, fa1=fa1, fa2=fa2, fa2_bwd=fa2_bwd, decode=decode)


def trace(algo, seqlen=8, head_dim=4, block_m=2, block_n=2, causal=False, seed=0, itemsize=2):
    """Run one algorithm at tile granularity; ``itemsize`` is the bytes per element counted as moved."""
    if algo not in ALGORITHMS:
        raise ValueError(f"algo must be one of {sorted(ALGORITHMS)}, got {algo!r}")
    for name, value in (("seqlen", seqlen), ("head_dim", head_dim), ("block_m", block_m), ("block_n", block_n)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    t = ALGORITHMS[algo](seqlen, head_dim, block_m, block_n, causal, seed, itemsize)
    t.params = dict(seqlen=seqlen, head_dim=head_dim, block_m=block_m, block_n=block_n, causal=bool(causal))
    return t
