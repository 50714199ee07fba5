#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""A MoE feed-forward layer as a server runs it on CPU, over fabep.

Each rank holds `tokens` tokens (bf16, hidden values each).  A router
(a linear layer, softmax, top-k, weights renormalized to sum 1) picks
top_k of E experts per token; the experts are SwiGLU MLPs
(y = W2 (silu(W1 x) * (W3 x))) with random weights, E / ranks of them
on each rank.  fabep dispatches the tokens, each rank runs its experts
on the rows of each local expert (RecvView.row_offsets), and fabep
combines the outputs with the router weights.  With --zero-copy the
rows stay where they landed and each expert gathers its input through
RecvView.row_index, as the gloo layer below gathers by expert id.

The same layer then runs a second way, the way a Python program does it
today: torch.distributed.all_to_all_single on gloo (each (token, expert)
pair sent to the expert's rank, sorted by destination, the outputs sent
back and summed with index_add_).  Both are checked against the layer
computed in one process (rank 0 gathers every rank's tokens and holds
every expert), and rank 0 prints the time per layer, the share of it in
communication, and the speedup of dispatch + combine over gloo.

Run it on N local ranks, or under mpirun or torchrun:

    python3 -m fabep.run -n 4 examples/moe_layer.py
    mpirun -n 4 -x FABEP_ROOT=127.0.0.1:29600 python3 examples/moe_layer.py
    torchrun --nproc_per_node 4 examples/moe_layer.py

(mpirun: --oversubscribe where the machine has fewer cores than ranks.
Debian's torch 1.13 under Python 3.11 knows only that spelling of
--nproc_per_node, and its default -r/-t values fail there: give them per
local rank, -r 0:1,1:1,2:1,3:1 -t 0:1,1:1,2:1,3:1 for four.)

Sizes: --hidden 7168 --experts 256 --top-k 8 --tokens 128 (a DeepSeek-V3
layer's routing) with --ffn 16 (a narrow expert: the figure of interest
is the communication; raise it for a realistic compute share).
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fabep


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128,
                    help="tokens per rank")
    ap.add_argument("--ffn", type=int, default=16,
                    help="intermediate size of each expert")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-gloo", action="store_true",
                    help="skip the all_to_all_single comparison")
    ap.add_argument("--zero-copy", action="store_true",
                    help="leave the rows where they landed: each expert "
                         "gathers its input by RecvView.row_index, as the "
                         "gloo layer gathers by expert id")
    return ap.parse_args()


# -- the model ---------------------------------------------------------------
def expert_weights(e, hidden, ffn, seed):
    """Expert e's (W1, W3, W2), bf16, the same on every rank."""
    g = torch.Generator().manual_seed(seed * 100003 + e)
    s1, s2 = hidden ** -0.5, ffn ** -0.5
    return ((torch.randn(ffn, hidden, generator=g) * s1).bfloat16(),
            (torch.randn(ffn, hidden, generator=g) * s1).bfloat16(),
            (torch.randn(hidden, ffn, generator=g) * s2).bfloat16())


def expert(x, w):
    """SwiGLU MLP on rows x (bf16 [n, hidden]) -> bf16 [n, hidden];
    w: (W1, W3, W2) in fp32 (the bf16 weights, widened once)."""
    w1, w3, w2 = w
    xf = x.float()
    h = F.silu(xf @ w1.t()) * (xf @ w3.t())
    return (h @ w2.t()).bfloat16()


def widen(w):
    return tuple(m.float() for m in w)


def router(x, wr, top_k):
    """Softmax over the experts, top-k, weights renormalized to sum 1."""
    p = torch.softmax(x.float() @ wr.t(), dim=-1)
    w, ids = torch.topk(p, top_k, dim=-1)
    return ids.int(), (w / w.sum(-1, keepdim=True)).float()


def tokens_of(rank, a):
    g = torch.Generator().manual_seed(a.seed * 7919 + rank)
    return torch.randn(a.tokens, a.hidden, generator=g).bfloat16()


def router_weights(a):
    g = torch.Generator().manual_seed(a.seed)
    return torch.randn(a.experts, a.hidden, generator=g) * a.hidden ** -0.5


def reference_layer(x, ids, w, weights):
    """The layer in one process, in fp32 from bf16 expert outputs."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in torch.unique(ids).tolist():
        t, k = (ids == e).nonzero(as_tuple=True)
        out.index_add_(0, t, expert(x[t], widen(weights[e])).float() *
                       w[t, k][:, None])
    return out


# -- the layer over fabep -----------------------------------------------------
def fabep_layer(moe, x, ids, w, local, first):
    """One layer; returns (out, seconds in dispatch + combine, total)."""
    t0 = time.perf_counter()
    v = moe.dispatch(x, ids, w)
    t1 = time.perf_counter()
    rows = v.x
    y = torch.empty(v.rows, x.shape[1], dtype=rows.dtype)
    offs = v.offsets()
    # zero-copy: rows are the receive slots, expert-major row r is
    # rows[row_index[r]]; y is expert-major either way
    idx = v.row_index.long() if moe.zero_copy else None
    for i in range(v.local_experts):
        lo, hi = offs[i], offs[i + 1]
        if hi > lo:
            xe = rows[lo:hi] if idx is None else \
                rows.index_select(0, idx[lo:hi])
            y[lo:hi] = expert(xe, local[first + i])
    t2 = time.perf_counter()
    out = moe.combine(y)
    t3 = time.perf_counter()
    return out, (t1 - t0) + (t3 - t2), t3 - t0


# -- the same layer with torch.distributed.all_to_all_single on gloo ---------
def gloo_layer(x, ids, w, local, per_rank, group):
    """One layer, (token, expert) pairs through all_to_all_single."""
    nranks = dist.get_world_size(group)
    n, k = ids.shape
    t0 = time.perf_counter()
    flat = ids.reshape(-1).long()
    tok = torch.arange(n).repeat_interleave(k)
    wt = w.reshape(-1)
    keep = flat >= 0
    flat, tok, wt = flat[keep], tok[keep], wt[keep]
    dest = flat // per_rank
    order = torch.argsort(dest, stable=True)
    flat, tok, wt = flat[order], tok[order], wt[order]
    send = torch.bincount(dest, minlength=nranks)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    ss, rs = send.tolist(), recv.tolist()
    # gloo has no bf16: the rows travel as their bits, in fp16 clothing
    rows = torch.empty(sum(rs), x.shape[1], dtype=torch.float16)
    dist.all_to_all_single(rows, x[tok].view(torch.float16), rs, ss,
                           group=group)
    eids = torch.empty(sum(rs), dtype=torch.int64)
    dist.all_to_all_single(eids, flat, rs, ss, group=group)
    t1 = time.perf_counter()
    rows = rows.view(torch.bfloat16)
    if local is None:  # dispatch + combine alone: the rows go back
        y = rows
    else:
        y = torch.empty_like(rows)
        for e in torch.unique(eids).tolist():
            sel = (eids == e).nonzero(as_tuple=True)[0]
            y[sel] = expert(rows[sel], local[e])
    t2 = time.perf_counter()
    back = torch.empty(sum(ss), x.shape[1], dtype=torch.float16)
    dist.all_to_all_single(back, y.view(torch.float16), ss, rs, group=group)
    out = torch.zeros(x.shape, dtype=torch.float32)
    out.index_add_(0, tok, back.view(torch.bfloat16).float() * wt[:, None])
    out = out.bfloat16()
    t3 = time.perf_counter()
    return out, (t1 - t0) + (t3 - t2), t3 - t0


# -- start-up under fabep.run, mpirun or torchrun -----------------------------
def start(heap):
    """(comm, rank, size): torch.distributed on gloo for the comparison
    and the check, and a fabep communicator."""
    env = os.environ
    if "RANK" in env and "MASTER_ADDR" in env and "FABEP_RANK" not in env:
        dist.init_process_group("gloo")       # torchrun
        comm = fabep.Comm.from_process_group(heap_size=heap)
    else:                                     # fabep.run, mpirun, Slurm
        comm = fabep.Comm.from_env(heap_size=heap)
        host = env.get("FABEP_ROOT", "127.0.0.1:29600").rsplit(":", 1)[0]
        dist.init_process_group("gloo", init_method="tcp://%s:%d" % (
            host, gloo_port(comm, host)), rank=comm.rank,
            world_size=comm.size)
    return comm, comm.rank, comm.size


def gloo_port(comm, host):
    """A free port on rank 0's host for gloo's store, which rank 0 finds
    and puts into every rank's heap with a signal.  A fixed port next to
    FABEP_ROOT's may be taken: the ranks' own connections to FABEP_ROOT
    get their source ports from the same range."""
    box = comm.heap_alloc(8)
    sig = comm.heap_alloc(8)
    if comm.rank == 0:
        bare = host.strip("[]")  # FABEP_ROOT's IPv6 form: [addr]:port
        s = socket.socket(socket.AF_INET6 if ":" in bare else socket.AF_INET,
                          socket.SOCK_STREAM)
        s.bind((bare, 0))
        box.numpy("i32")[0] = s.getsockname()[1]
        s.close()
        for peer in range(1, comm.size):
            comm.put_signal(peer, box, box, 8, sig)
        comm.flush()
    else:
        comm.wait(sig, 1)
    return int(box.numpy("i32")[0])


def size_from_env():
    for r, s in (("FABEP_RANK", "FABEP_WORLD_SIZE"), ("RANK", "WORLD_SIZE"),
                 ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if os.environ.get(s):
            return int(os.environ[s])
    return 1


def main():
    a = parse()
    torch.set_num_threads(1)
    nranks = size_from_env()
    heap = fabep.MoE.heap_bytes(nranks, a.experts, a.top_k, a.hidden,
                                a.tokens) + (16 << 20)
    comm, rank, nranks = start(heap)
    if a.experts % nranks:
        sys.exit("--experts %d is not a multiple of %d ranks" % (a.experts,
                                                                  nranks))
    per_rank = a.experts // nranks
    first = rank * per_rank
    mine = range(first, first + per_rank)
    local = {e: widen(expert_weights(e, a.hidden, a.ffn, a.seed))
             for e in mine}
    wr = router_weights(a)
    x = tokens_of(rank, a)
    ids, w = router(x, wr, a.top_k)
    moe = fabep.MoE(comm, a.experts, a.top_k, a.hidden, a.tokens,
                    zero_copy=a.zero_copy)

    # the two ways alternate, iteration by iteration, so that a busy
    # machine slows both alike
    fab, glo, fab_alone, glo_alone = [], [], [], []

    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    ys = {}

    def fab_comm():
        # dispatch + combine alone: the expert outputs are the rows (or,
        # zero-copy, rows of the same count that stand in for them)
        v = moe.dispatch(x, ids, w)
        if not moe.zero_copy:
            moe.combine(v.x)
            return
        y = ys.get(v.rows)
        if y is None:
            y = ys[v.rows] = torch.zeros(v.rows, a.hidden,
                                         dtype=torch.bfloat16)
        moe.combine(y)

    for i in range(a.warmup + a.iters):
        keep = i >= a.warmup
        dist.barrier()
        r = fabep_layer(moe, x, ids, w, local, first)
        if keep:
            fab.append(r)
        t = timed(fab_comm)
        if keep:
            fab_alone.append(t)
        if a.no_gloo:
            continue
        dist.barrier()
        r = gloo_layer(x, ids, w, local, per_rank, None)
        if keep:
            glo.append(r)
        t = timed(lambda: gloo_layer(x, ids, w, None, per_rank, None))
        if keep:
            glo_alone.append(t)
    out_fab = fab[-1][0]

    # the check: rank 0 computes every rank's layer in one process
    outs = [torch.empty_like(out_fab).view(torch.float16)
            for _ in range(nranks)]
    dist.all_gather(outs, out_fab.view(torch.float16))
    if glo:
        gouts = [torch.empty_like(out_fab).view(torch.float16)
                 for _ in range(nranks)]
        dist.all_gather(gouts, glo[-1][0].view(torch.float16))
    ok = True
    if rank == 0:
        weights = {e: expert_weights(e, a.hidden, a.ffn, a.seed)
                   for e in range(a.experts)}
        for r in range(nranks):
            xr = tokens_of(r, a)
            ir, wgt = router(xr, wr, a.top_k)
            ref = reference_layer(xr, ir, wgt, weights)
            scale = float(ref.abs().max()) or 1.0
            for name, got in (("fabep", outs[r]),) + (
                    (("gloo", gouts[r]),) if glo else ()):
                err = float((got.view(torch.bfloat16).float() - ref).abs()
                            .max()) / scale
                if not err <= 2e-2:  # a NaN anywhere fails too
                    ok = False
                    print("rank %d: %s output differs from the one-process "
                          "layer: max error %.3g of max |out|"
                          % (r, name, err))

    # times: the median over iterations, the slowest rank's
    def med(rows, i=None):
        t = torch.tensor([statistics.median(r if i is None else r[i]
                                            for r in rows)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)
    f_comm, f_total = med(fab, 1), med(fab, 2)
    if rank == 0:
        print("moe_layer: %d ranks, %d tokens per rank, hidden %d, top-%d of "
              "%d experts, ffn %d, %s%s" % (nranks, a.tokens, a.hidden,
                                            a.top_k, a.experts, a.ffn,
                                            comm.provider, ", zero-copy"
                                            if a.zero_copy else ""))
        print("fabep: %.3f ms per layer, dispatch + combine %.3f ms (%.0f%% "
              "of the layer)" % (f_total * 1e3, f_comm * 1e3,
                                 100 * f_comm / f_total))
    f_alone = med(fab_alone)
    if rank == 0 and not glo:
        print("dispatch + combine alone: fabep %.3f ms" % (f_alone * 1e3))
    if glo:
        g_comm, g_total = med(glo, 1), med(glo, 2)
        g_alone = med(glo_alone)
        if rank == 0:
            print("gloo all_to_all_single: %.3f ms per layer, dispatch + "
                  "combine %.3f ms (%.0f%% of the layer)" % (
                      g_total * 1e3, g_comm * 1e3, 100 * g_comm / g_total))
            print("dispatch + combine alone: fabep %.3f ms, gloo %.3f ms: "
                  "speedup %.1fx" % (f_alone * 1e3, g_alone * 1e3,
                                     g_alone / f_alone))
            print("speedup of the layer: %.2fx" % (g_total / f_total))
    if rank == 0:
        print("result: %s" % ("correct" if ok else "WRONG"))
    flag = torch.tensor([1 if ok else 0])
    dist.broadcast(flag, 0)
    moe.close()
    comm.close()
    dist.destroy_process_group()
    return 0 if int(flag) else 1


if __name__ == "__main__":
    sys.exit(main())
