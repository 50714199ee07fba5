# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""MoE dispatch and combine on 1 to 4 ranks, torch and numpy inputs,
against references computed here from every rank's inputs."""
import numpy as np
import pytest
import torch

import ranks
from helpers import (tokens, to_numpy, to_torch, e4m3_decode, expected_rows,
                     reference_combine)

E, K, H, MAXT = 12, 3, 48, 12
NTOK = [12, 5, 0, 7]  # rank 2 sends nothing


def _inputs(nranks, seed, token_type):
    """Every rank's (x as sent, ids, w, value of x as it travels)."""
    out = []
    for r in range(nranks):
        x, ids, w = tokens(r, NTOK[r], H, E, K, seed)
        if token_type == "bf16":
            xs = x.bfloat16()
            val = xs.float()
        elif token_type == "fp32":
            xs, val = x, x
        elif token_type == "fp8":
            xs, val = x.bfloat16(), x.bfloat16().float()
        else:  # fp8_prequant: codes and scales chosen here
            g = torch.Generator().manual_seed(seed * 7 + r)
            codes = torch.randint(0, 256, (NTOK[r], H), generator=g).to(
                torch.uint8)
            codes[(codes & 0x7F) == 0x7F] = 0x10  # no NaN codes
            sc = torch.rand(NTOK[r], 1, generator=g) + 0.5
            xs = (codes, sc)
            val = e4m3_decode(codes) * sc
        out.append((xs, ids, w, val))
    return out


class _Sub(torch.Tensor):
    """A tensor subclass (as nn.Parameter is): the binding's full checks
    take it, where plain tensors take its fast path."""


def _conv(t, kind):
    if kind == "subclass":
        return t.as_subclass(_Sub)
    return to_numpy(t) if kind == "numpy" else t


def _check_dispatch(me, nranks, inp, v, token_type, kind, zero_copy):
    rows, offs = expected_rows(me, nranks, [(i[3], i[1], i[2]) for i in inp],
                               E, K)
    assert v.rows == len(rows)
    assert v.local_experts == E // nranks
    assert v.first_expert == me * (E // nranks)
    assert list(to_torch(v.row_offsets).long()) == offs
    assert list(to_torch(v.expert_ids).long()) == list(
        range(me * E // nranks, (me + 1) * E // nranks))
    assert list(to_torch(v.expert_counts).long()) == [
        offs[i + 1] - offs[i] for i in range(len(offs) - 1)]
    if not rows:
        return torch.zeros(0, H), []
    src = to_torch(v.src_info).long()
    assert src.tolist() == [[s, t, k] for s, t, k, _ in rows]
    wt = to_torch(v.weights)
    assert torch.equal(wt, torch.tensor([float(inp[s][2][t, k])
                                         for s, t, k, _ in rows]))
    idx = to_torch(v.row_index).long()
    if not zero_copy:
        assert idx.tolist() == list(range(len(rows)))
    x = to_torch(v.x)[idx]
    want = torch.stack([inp[s][3][t] for s, t, _, _ in rows])
    if token_type in ("fp8", "fp8_prequant"):
        sc = to_torch(v.scales)[idx]
        assert sc.shape[1] == 1
        got = e4m3_decode(x) * sc
        if token_type == "fp8_prequant":
            codes = torch.stack([inp[s][0][0][t] for s, t, _, _ in rows])
            assert torch.equal(x, codes)
            assert torch.allclose(got, want, rtol=1e-6, atol=0)
        else:
            assert ((got - want).abs() <=
                    want.abs() / 16 + sc * 2.0 ** -9 + 1e-7).all()
    else:
        got = x
        assert torch.equal(got, want)
    return got, [e for _, _, _, e in rows]


def _expert_out(vals, eids, combine_type, kind):
    y = vals * (1 + torch.tensor(eids, dtype=torch.float32) / 64)[:, None]
    y = y.bfloat16() if combine_type == "bf16" else y
    return _conv(y.contiguous(), kind), y.float()


def _moe_body(me, nranks, kind, prov=None):
    import fabep
    comm = fabep.Comm.from_env()
    assert (comm.rank, comm.size) == (me, nranks)
    assert prov is None or comm.provider.split(";")[0] == prov, comm.provider
    checked = 0
    for token_type, combine_type, zc in (("bf16", "bf16", False),
                                         ("fp32", "fp32", False),
                                         ("bf16", "fp32", True),
                                         ("fp8", "bf16", False),
                                         ("fp8_prequant", "bf16", True)):
        seed = checked + 1
        inp = _inputs(nranks, seed, token_type)
        xs, ids, w, val = inp[me]
        moe = fabep.MoE(comm, E, K, H, MAXT, token_type=token_type,
                        combine_type=combine_type, zero_copy=zc)
        if token_type == "fp8_prequant":
            x_in, scales = _conv(xs[0], kind), _conv(xs[1].contiguous(), kind)
        else:
            x_in, scales = _conv(xs, kind), None
        v = moe.dispatch(x_in, _conv(ids, kind), _conv(w, kind), scales=scales)
        assert isinstance(v.x, np.ndarray if kind == "numpy" else
                          torch.Tensor)
        got, eids = _check_dispatch(me, nranks, inp, v, token_type, kind, zc)
        # the expert outputs, in the order the dispatch delivered (zero
        # copy: the rows of x in row_index order)
        y, yf = _expert_out(got, eids, combine_type, kind)
        # the caller's out on every other configuration, else a new one
        out_in = _conv(torch.full((NTOK[me], H), float("nan"), dtype={
            "bf16": torch.bfloat16, "fp32": torch.float32}[combine_type]),
            kind) if checked % 2 else None
        out = moe.combine(y, out=out_in)
        assert out_in is None or out is out_in
        assert isinstance(out, np.ndarray if kind == "numpy" else
                          torch.Tensor)
        assert tuple(out.shape) == (NTOK[me], H)
        ref = reference_combine(val, ids, w)
        refabs = reference_combine(val.abs(), ids, w.abs())
        tol = {"bf16": 2.0 ** -6, "fp32": 1e-5}[combine_type]
        if token_type == "fp8":
            tol = 2.0 ** -3
        err = (to_torch(out).double() - ref).abs()
        assert (err <= tol * refabs + 1e-6).all(), \
            (token_type, combine_type, zc, float(err.max()))
        t = moe.timing()
        assert t.dispatch_pack_ns > 0
        if nranks > 1:
            assert t.dispatch_wire_bytes > 0
        moe.close()
        checked += 1
    comm.close()
    return checked


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["torch", "numpy", "subclass"])
def test_dispatch_combine(nranks, kind):
    assert ranks.run(nranks, _moe_body, kind) == [5] * nranks


def _provider_body(me, nranks, prov):
    import fabep
    # probed in the rank: the test process itself never opens libfabric
    # (its forked ranks must not inherit it)
    if not fabep.providers(prov):
        return "absent"
    return _moe_body(me, nranks, "torch", prov)


@pytest.mark.parametrize("prov", ["tcp", "udp", "net", "sockets"])
def test_dispatch_combine_providers(prov):
    """The same round trips over the network providers (tcp;ofi_rxm,
    udp;ofi_rxd, net without atomics, sockets), whose transfers move
    only while a rank progresses, so every wait must drive them."""
    n = 2 if prov == "sockets" else 3
    got = ranks.run(n, _provider_body, prov, timeout=180,
                    env={"FABEP_PROVIDER": prov})
    if "absent" in got:
        pytest.skip("libfabric offers no %s RMA provider here" % prov)
    assert got == [5] * n


def _halves_body(me, nranks, kind):
    """The halves give the bits of the whole calls; the send buffer; the
    backward passes; the row callback; the views' lifetime."""
    import fabep
    comm = fabep.Comm.from_env()
    moe = fabep.MoE(comm, E, K, H, MAXT, buffer_sets=2)
    inp = _inputs(nranks, 11, "bf16")
    xs, ids, w, val = inp[me]
    x_in, ids_in, w_in = (_conv(t, kind) for t in (xs, ids, w))
    v = moe.dispatch(x_in, ids_in, w_in)
    rows_full = to_torch(v.x).clone()
    got, eids = _check_dispatch(me, nranks, inp, v, "bf16", kind, False)
    y, _ = _expert_out(got, eids, "bf16", kind)
    out_full = to_torch(moe.combine(y)).clone()

    # halves, with compute between them
    moe.dispatch_send(x_in, ids_in, w_in)
    v = moe.dispatch_recv()
    assert torch.equal(to_torch(v.x), rows_full)
    moe.combine_send(y)
    out = moe.combine_recv()
    assert torch.equal(to_torch(out), out_full)

    # the send buffer: rows written into library memory, sent without copy
    sbx, sbs = moe.send_buffer(kind)
    assert sbs is None and tuple(sbx.shape) == (MAXT, H)
    n = NTOK[me]
    sbx[:n] = x_in
    moe.dispatch_send(sbx[:n], ids_in, w_in)
    v = moe.dispatch_recv()
    assert torch.equal(to_torch(v.x), rows_full)
    # combine into a caller's wider tensor (rows apart), row callback
    seen = []
    wide = fabep._tensor.empty(kind, (n, H + 16), "bf16")
    res = moe.combine(y, out=wide[:, :H],
                      row_callback=lambda t, row: seen.append(t))
    assert sorted(seen) == list(range(n))
    assert torch.equal(to_torch(wide[:, :H]), out_full)
    assert res is not None

    # lifetime: the view is stale after the next call; arrays taken from
    # it view the library's memory (buffer_sets=2: the set is reused by
    # the dispatch after next)
    v1 = moe.dispatch(x_in, ids_in, w_in)
    x1 = v1.x
    moe.combine(y)
    with pytest.raises(fabep.StaleViewError):
        v1.x  # read before the call
    with pytest.raises(fabep.StaleViewError):
        v1.weights  # not read before
    assert not v1.valid()
    x2 = _conv(torch.zeros(n, H).bfloat16(), kind)
    moe.dispatch(x2, ids_in, w_in)
    moe.combine(y)
    v3 = moe.dispatch(x2, ids_in, w_in)
    if v3.rows:
        # the same memory now holds the zero rows of the latest dispatch
        assert float(to_torch(x1).abs().max()) == 0.0
    moe.combine(y)

    # backward: combine's backward dispatches the gradient with the
    # previous routing and weights; dispatch's backward sums unweighted
    vb = moe.dispatch(x_in, ids_in, w_in)
    wb = to_torch(vb.weights).clone()
    moe.combine(y)
    g = moe.combine_backward(x_in)
    assert torch.equal(to_torch(g.x), rows_full)
    assert torch.equal(to_torch(g.weights), wb)
    gin = moe.dispatch_backward(_conv(to_torch(g.x).bfloat16(), kind))
    ref = val.double() * (ids >= 0).sum(1, keepdim=True)
    assert ((to_torch(gin).double() - ref).abs() <=
            2.0 ** -7 * ref.abs() + 1e-6).all()
    comm.close()
    return True


@pytest.mark.parametrize("nranks", [1, 3])
@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_halves_buffers_backward_lifetime(nranks, kind):
    assert all(ranks.run(nranks, _halves_body, kind))


def _keepalive_body(me, nranks, kind):
    """A view of library memory keeps what owns that memory alive: the
    receive view's arrays and the send buffer their MoE handle, a heap
    block's array its communicator, after the caller has dropped both."""
    import gc
    import weakref
    import fabep

    def make():
        comm = fabep.Comm.from_env()
        moe = fabep.MoE(comm, E, K, H, MAXT)
        x, ids, w = tokens(me, 4, H, E, K, 7, unrouted=0)
        xb = x.bfloat16()
        v = moe.dispatch(_conv(xb, kind), _conv(ids, kind), _conv(w, kind))
        blk = comm.heap_alloc(64)
        b = blk.numpy() if kind == "numpy" else blk.torch()
        b[:] = 7
        sb = moe.send_buffer(kind)[0]
        return (v.x, v.weights, sb, b, weakref.ref(moe), weakref.ref(comm),
                to_torch(v.x).clone())
    rows, weights, sb, b, moe_ref, comm_ref, want = make()
    gc.collect()
    assert moe_ref() is not None and comm_ref() is not None
    assert torch.equal(to_torch(rows), want)
    assert tuple(weights.shape) == (want.shape[0],)
    assert int(b[63]) == 7
    sb[0, 0] = sb[0, 0]  # the send buffer is still mapped and writable
    del rows, weights, sb
    gc.collect()
    assert moe_ref() is None  # the last view of the handle is gone
    assert comm_ref() is not None  # the heap block's array keeps it
    del b
    gc.collect()
    assert comm_ref() is None
    return True


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_views_keep_their_owner(kind):
    assert ranks.run(1, _keepalive_body, kind) == [True]
