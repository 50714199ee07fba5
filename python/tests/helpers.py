# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""Inputs every rank can regenerate for every other rank, and scalar
references of dispatch, combine and FP8."""
import os
import sys
import tempfile

import numpy as np
import torch


def tokens(rank, n, hidden, experts, top_k, seed, unrouted=0.1):
    """Rank `rank`'s inputs: x fp32 [n, hidden], ids int32 [n, top_k]
    (distinct per token, some -1), weights fp32 [n, top_k]."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    x = torch.randn(n, hidden, generator=g)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k]
                       for _ in range(n)]).int() if n else \
        torch.empty(0, top_k, dtype=torch.int32)
    drop = torch.rand(n, top_k, generator=g) < unrouted
    ids[drop] = -1
    w = torch.rand(n, top_k, generator=g)
    return x, ids, w


def to_numpy(t):
    """A torch tensor as the numpy array fabep takes (bf16: uint16 bits)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def to_torch(a):
    """A tensor from a fabep output (numpy or torch) as fp32 torch."""
    if isinstance(a, np.ndarray):
        if a.dtype == np.uint16:
            return torch.from_numpy(a.view(np.int16).copy()).view(
                torch.bfloat16).float()
        if a.dtype == np.uint8:
            return torch.from_numpy(np.array(a))
        if a.dtype == np.uint32:
            return torch.from_numpy(a.astype(np.int64))
        return torch.from_numpy(np.array(a)).float()
    return a.float() if a.dtype != torch.uint8 else a.clone()


def e4m3_decode(codes):
    """OCP e4m3fn codes (uint8 tensor) to fp32, scalar by scalar."""
    c = codes.to(torch.int32)
    s = torch.where(c & 0x80 != 0, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = (c & 7).float()
    v = torch.where(e == 0, m / 8 * 2.0 ** -6,
                    (1 + m / 8) * torch.pow(2.0, (e - 7).float()))
    v = torch.where((e == 15) & ((c & 7) == 7), float("nan"), v)
    return s * v


def expected_rows(me, nranks, inputs, experts, top_k):
    """Reference dispatch for rank `me`: per local expert, the (src, t,
    k) rows in source-rank, token, k order."""
    local = experts // nranks
    rows = []
    offs = [0]
    for e in range(me * local, (me + 1) * local):
        for src, (x, ids, w) in enumerate(inputs):
            for t in range(ids.shape[0]):
                for k in range(top_k):
                    if int(ids[t, k]) == e:
                        rows.append((src, t, k, e))
        offs.append(len(rows))
    return rows, offs


def reference_combine(x, ids, w, weighted=True):
    """out[t] = sum_k w[t,k] * x[t] * (1 + ids[t,k] / 64) over routed k
    (the expert function the tests use), in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e >= 0:
                out[t] += (float(w[t, k]) if weighted else 1.0) * \
                    x[t].double() * (1 + e / 64)
    return out


class Stderr:
    """What this process writes to file descriptor 2 (the library's log
    lines) inside the block, in .text after it."""

    def __enter__(self):
        sys.stderr.flush()
        self._f = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._f.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._f.seek(0)
        self.text = self._f.read().decode(errors="replace")
        self._f.close()
