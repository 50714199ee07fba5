# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""The binding's cost per call over the bare C call (not a test).

    python3 python/tests/bench_overhead.py            # one rank
    python3 -m fabep.run -n 2 python/tests/bench_overhead.py

Times Comm.barrier and MoE.dispatch + MoE.combine against the same C
calls made through bare ctypes with every pointer computed beforehand,
in alternating blocks (so a busy machine slows both alike), for a tiny
dispatch (1 token) and the decode case (128 tokens, hidden 7168, top-8
of 256).  --cpu times the calling thread's CPU time instead of the wall
clock (steadier on a loaded machine; with FABEP_THREADS=1 the library's
work runs on that thread).  Rank 0 prints median microseconds per
iteration.
"""
import argparse
import ctypes
import os
import statistics
import time

import torch

import fabep
from fabep import _lib


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    clock = time.thread_time if a.cpu else time.perf_counter
    L = _lib.lib
    nranks = int(os.environ.get("FABEP_WORLD_SIZE", "1"))
    comm = fabep.Comm.from_env(heap_size=fabep.MoE.heap_bytes(
        nranks, 256, 8, 7168, 128) + (64 << 20))

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
        moe.close()
    comm.close()


if __name__ == "__main__":
    main()
