# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""The binding's cost per call over the bare C call (not a test).

    python3 python/tests/bench_overhead.py            # one rank
    python3 -m fabep.run -n 2 python/tests/bench_overhead.py

Times Comm.barrier, MoE.dispatch + MoE.combine and the AllReduce calls
against the same C calls made through bare ctypes with every pointer
computed beforehand, in alternating blocks (so a busy machine slows both
alike), for a tiny dispatch (1 token), the decode case (128 tokens,
hidden 7168, top-8 of 256) and one row of 7168 fp32.  --cpu times the
calling thread's CPU time instead of the wall clock (steadier on a
loaded machine; with FABEP_THREADS=1 the library's work runs on that
thread).  --stub replaces the MoE and AllReduce C calls by no-ops after
their first call, for both sides: what is left is the binding's own
work.  Rank 0 prints median microseconds per iteration.
"""
import argparse
import ctypes
import os
import statistics
import time

import types

import torch

import fabep
from fabep import _lib
from fabep import allreduce as _allreduce_mod
from fabep import moe as _moe_mod


def _stub():
    """The C calls the MoE and AllReduce handles make, as no-ops that
    succeed; returns the namespace to call them through."""
    def ok(*args):
        return 0
    ns = types.SimpleNamespace(**{n: ok for n in (
        "fabep_moe_dispatch", "fabep_moe_combine", "fabep_allreduce",
        "fabep_allreduce_rmsnorm", "fabep_allreduce_rmsnorm_fp8")})
    _moe_mod.lib = _allreduce_mod.lib = ns
    return ns


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--stub", action="store_true")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    clock = time.thread_time if a.cpu else time.perf_counter
    L = _lib.lib
    nranks = int(os.environ.get("FABEP_WORLD_SIZE", "1"))
    comm = fabep.Comm.from_env(heap_size=fabep.MoE.heap_bytes(
        nranks, 256, 8, 7168, 128) + fabep.AllReduce.heap_bytes(
        nranks, 16, 7168, "fp32") + (64 << 20))

    def bench(fn, n):
        t0 = clock()
        for _ in range(n):
            fn()
        return (clock() - t0) / n * 1e6

    def compare(name, py, raw, n):
        p, r = [], []
        for _ in range(a.rounds):
            p.append(bench(py, n))
            r.append(bench(raw, n))
        mp, mr = statistics.median(p), statistics.median(r)
        if comm.rank == 0:
            print("%-40s binding %9.2f us  C %9.2f us  overhead %7.2f us "
                  "(%5.1f%%)" % (name, mp, mr, mp - mr, 100 * (mp - mr) / mr))

    h = comm._h
    compare("barrier", comm.barrier, lambda: L.fabep_barrier(h), 1000)
    for (E, K, H, T, n) in ((8, 2, 64, 1, 1000), (256, 8, 7168, 128, 10)):
        E = max(E // nranks, 1) * nranks
        moe = fabep.MoE(comm, E, K, H, T)
        g = torch.Generator().manual_seed(comm.rank)
        x = torch.randn(T, H, generator=g).bfloat16()
        ids = torch.stack([torch.randperm(E, generator=g)[:K]
                           for _ in range(T)]).int()
        w = torch.rand(T, K, generator=g)
        v = moe.dispatch(x, ids, w)
        y = v.x.clone()
        out = torch.empty(T, H, dtype=torch.bfloat16)
        moe.combine(y, out=out)
        rec = _lib.new_output(_lib.MoeRecv)
        mh, nofn = moe._h, _lib.ROW_FN()
        if a.stub:
            L = _stub()
        xp, ip, wp = x.data_ptr(), ids.data_ptr(), w.data_ptr()
        yp, op = y.data_ptr(), out.data_ptr()

        def py():
            moe.dispatch(x, ids, w)
            moe.combine(y, out=out)

        def raw():
            L.fabep_moe_dispatch(mh, xp, None, T, ip, wp, ctypes.byref(rec))
            L.fabep_moe_combine(mh, yp, H, 0, op, H, nofn, None)
        compare("dispatch+combine %d tok, h %d, top-%d/%d" % (T, H, K, E),
                py, raw, n)
        _moe_mod.lib = _allreduce_mod.lib = L = _lib.lib
        moe.close()
    ar = fabep.AllReduce(comm, 16, 7168, "fp32")
    x = torch.randn(1, 7168)
    out, gamma = torch.empty_like(x), torch.ones(7168)
    codes = torch.empty(1, 7168, dtype=torch.uint8)
    scales = torch.empty(1)
    ar.allreduce_rmsnorm_fp8(x, gamma, out=codes, scales=scales)
    prm = _lib.rmsnorm_params()
    prm.gamma, prm.eps, prm.scale_ub = gamma.data_ptr(), 1e-6, 1e4
    ah, xp, op = ar._h, x.data_ptr(), out.data_ptr()
    cp, sp, pp = codes.data_ptr(), scales.data_ptr(), ctypes.byref(prm)
    if a.stub:
        L = _stub()
    compare("allreduce 1 x 7168 fp32", lambda: ar.allreduce(x, out),
            lambda: L.fabep_allreduce(ah, xp, op, 1, 7168), 1000)
    compare("allreduce_rmsnorm 1 x 7168 fp32",
            lambda: ar.allreduce_rmsnorm(x, gamma, out=out),
            lambda: L.fabep_allreduce_rmsnorm(ah, xp, 1, 7168, pp, op), 1000)
    compare("allreduce_rmsnorm_fp8 1 x 7168 fp32",
            lambda: ar.allreduce_rmsnorm_fp8(x, gamma, out=codes,
                                             scales=scales),
            lambda: L.fabep_allreduce_rmsnorm_fp8(ah, xp, 1, 7168, pp, cp,
                                                  sp), 1000)
    _moe_mod.lib = _allreduce_mod.lib = _lib.lib
    ar.close()
    comm.close()


if __name__ == "__main__":
    main()
