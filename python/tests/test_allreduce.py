# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""allreduce, allreduce_rmsnorm, allreduce_rmsnorm_fp8 on 1 to 4 ranks,
torch and numpy, against references computed here."""
import pytest
import torch

import ranks
from helpers import to_numpy, to_torch, e4m3_decode

ROWS, COLS = 6, 40


def _input(r, dtype):
    g = torch.Generator().manual_seed(77 + r)
    x = torch.randn(ROWS, COLS, generator=g) * (r + 1)
    return x.bfloat16() if dtype == "bf16" else x


def _sum(xs):
    """The sum in fp32 in the library's order for these small calls: the
    rank order with 2 or 3 ranks; from 4 ranks the log-step path's tree
    (x_j + x_(M+j) past the largest power of two M, then pairs, pairs of
    pairs)."""
    p = [x.float().clone() for x in xs]
    n = len(p)
    if n < 4:
        acc = p[0]
        for r in range(1, n):
            acc = acc + p[r]
        return acc
    m = 1
    while m * 2 <= n:
        m *= 2
    for j in range(n - m):
        p[j] = p[j] + p[m + j]
    w = 1
    while w < m:
        for j in range(0, m, 2 * w):
            p[j] = p[j] + p[j + w]
        w *= 2
    return p[0]


def _ar_body(me, n, dtype, kind):
    import fabep
    conv = to_numpy if kind == "numpy" else (lambda t: t)
    comm = fabep.Comm.from_env()
    ar = fabep.AllReduce(comm, ROWS, COLS, dtype)
    # the thresholds: the plain sum's own on 2 ranks (fabep_allreduce(3))
    # from 4 ranks the log-step path's: 32 KiB of fp32 sums below 8
    esize = 4 if dtype == "fp32" else 2
    os = (32 << 10) // 4 * esize if 4 <= n < 8 else \
        96 << 10 if n >= 8 and dtype == "fp32" else 32 << 10
    assert ar.onestage_max == os
    assert ar.sum_onestage_max == (1 << 20 if n == 2 else os)
    xs = [_input(r, dtype) for r in range(n)]
    # the sum in fp32, in the library's order, rounded once: bitwise
    acc = _sum(xs)
    want = acc.bfloat16().float() if dtype == "bf16" else acc
    out = ar.allreduce(conv(xs[me]))
    assert torch.equal(to_torch(out), want)
    # in place
    x = conv(xs[me].clone())
    ar.allreduce(x, out=x)
    assert torch.equal(to_torch(x), want)
    # fewer rows
    assert torch.equal(to_torch(ar.allreduce(conv(xs[me][:1].clone()))),
                       want[:1])

    g = torch.Generator().manual_seed(5)
    gamma = torch.rand(COLS, generator=g)
    gamma = gamma.bfloat16() if dtype == "bf16" else gamma
    resid = torch.randn(ROWS, COLS, generator=g)
    resid = resid.bfloat16() if dtype == "bf16" else resid
    eps, off = 1e-5, 1.0
    if dtype == "bf16":  # the sum and h are each rounded to bf16
        hr = (acc.bfloat16().float() + resid.float()).bfloat16().float()
    else:
        hr = acc + resid
    y = hr / torch.sqrt((hr * hr).mean(1, keepdim=True) + eps) * \
        (gamma.float() + off)
    res = conv(resid.clone())
    out = ar.allreduce_rmsnorm(conv(xs[me]), conv(gamma), eps=eps,
                               weight_offset=off, residual=res)
    tol = 2.0 ** -6 if dtype == "bf16" else 1e-5  # two bf16 roundings
    assert ((to_torch(out) - y).abs() <= tol * y.abs() + 1e-5).all()
    assert ((to_torch(res) - hr).abs() <= tol * hr.abs() + 1e-6).all()

    ub = 1e4
    q, sc = ar.allreduce_rmsnorm_fp8(conv(xs[me]), conv(gamma), eps=eps,
                                     weight_offset=off, scale_ub=ub)
    q, sc = to_torch(q), to_torch(sc)
    y0 = acc / torch.sqrt((acc * acc).mean(1, keepdim=True) + eps) * \
        (gamma.float() + off)
    want_sc = y0.abs().amax(1) / 448
    assert ((sc - want_sc).abs() <= 2.0 ** -6 * want_sc).all()
    deq = e4m3_decode(q) * sc[:, None]
    assert ((deq - y0).abs() <= y0.abs() / 8 + sc[:, None] * 2.0 ** -8).all()
    comm.close()
    return True


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("dtype,kind", [("fp32", "torch"), ("bf16", "torch"),
                                        ("bf16", "numpy")])
def test_allreduce(n, dtype, kind):
    assert all(ranks.run(n, _ar_body, dtype, kind))
