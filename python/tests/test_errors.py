# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""Bad input on one rank raises the same error class on every rank, and
none waits; the handle works again afterwards; a killed, stalled or
stopped rank gives an error that names it."""
import os
import signal
import sys
import time

import numpy as np
import pytest
import torch

import ranks
from helpers import Stderr, tokens, to_numpy

E, K, H, MAXT = 12, 2, 32, 6


def _bad_inputs(kind):
    """(name, mutate(x, ids, w) -> (x, ids, w), expected class name)."""
    def conv(t):
        return to_numpy(t) if kind == "numpy" else t
    torch_only = [] if kind == "numpy" else [
        # tensors whose memory does not hold their values as laid out
        ("sparse_x", lambda x, i, w: (x.to_sparse(), i, w),
         "InvalidArgumentError", "sparse_coo"),
        ("sparse_w", lambda x, i, w: (x, i, w.to_sparse()),
         "InvalidArgumentError", "sparse_coo"),
        ("neg_view_x", lambda x, i, w: (torch._neg_view(x), i, w),
         "InvalidArgumentError", "negative or conjugate"),
        ("neg_view_ids", lambda x, i, w: (x, torch._neg_view(i), w),
         "InvalidArgumentError", "negative or conjugate"),
    ]
    return torch_only + [
        ("dtype_x", lambda x, i, w: (conv(x.float()), conv(i), conv(w)),
         "InvalidArgumentError", "dtype"),
        ("dtype_ids", lambda x, i, w: (conv(x), conv(i.long()), conv(w)),
         "InvalidArgumentError", "dtype"),
        ("noncontig_x", lambda x, i, w: (
            conv(torch.cat([x, x], 1)[:, ::2]), conv(i), conv(w)),
         "InvalidArgumentError", "contiguous"),
        ("shape_x", lambda x, i, w: (conv(x[:, :-1].contiguous()), conv(i),
                                     conv(w)),
         "InvalidArgumentError", "shape"),
        ("shape_w", lambda x, i, w: (conv(x), conv(i), conv(w[:-1])),
         "InvalidArgumentError", "shape"),
        ("not_a_tensor", lambda x, i, w: (x.tolist(), conv(i), conv(w)),
         "InvalidArgumentError", "expected a torch tensor"),
        ("expert_range", lambda x, i, w: (conv(x), conv(_oob(i)), conv(w)),
         "RangeError", "expert id"),
        ("too_many", lambda x, i, w: (conv(torch.cat([x, x])),
                                      conv(torch.cat([i, i])),
                                      conv(torch.cat([w, w]))),
         "MessageSizeError", ""),
    ]


# what the C calls that pass a refusal on say, each not the reason
_REFUSAL_CALL_TEXT = ["NULL tokens", "NULL output for", "NULL input",
                      "NULL gamma", "num_experts 0", "dtype -1", "signal -1"]


def _quiet_refusals(body):
    """body(me, nranks, *args), with what rank 1 (the refusing rank, or
    rank 0 alone) writes to standard error checked after: the C calls
    that pass the package's own refusals on print nothing there
    (fabep_log_quiet(3)), since their complaint (NULL tokens, unknown
    flags) is not the reason, which the exception names."""
    def run(me, nranks, *args):
        if me != min(1, nranks - 1):
            return body(me, nranks, *args)
        with Stderr() as err:
            res = body(me, nranks, *args)
        sys.stderr.write(err.text)  # the C calls' own refusals
        for s in _REFUSAL_CALL_TEXT:
            assert s not in err.text, (s, err.text)
        return res
    return run


def _oob(ids):
    ids = ids.clone()
    ids[0, 0] = E
    return ids


def _bad_body(me, nranks, kind, bad_rank):
    import fabep
    comm = fabep.Comm.from_env()
    moe = fabep.MoE(comm, E, K, H, MAXT)
    x, ids, w = tokens(me, 4, H, E, K, 5)
    xb = x.bfloat16()
    conv = (lambda t: to_numpy(t)) if kind == "numpy" else (lambda t: t)
    seen = []
    for half in (False, True):
        for name, mutate, cls, text in _bad_inputs(kind):
            args = mutate(xb, ids, w) if me == bad_rank else \
                (conv(xb), conv(ids), conv(w))
            with pytest.raises(fabep.FabepError) as ei:
                if half:
                    moe.dispatch_send(*args)
                    moe.dispatch_recv()
                else:
                    moe.dispatch(*args)
            e = ei.value
            assert type(e).__name__ == cls, (name, type(e), str(e))
            assert e.code < 0
            if me == bad_rank:
                assert text in str(e), (name, str(e))
            seen.append(name)
            # the handle works again on every rank
            v = moe.dispatch(conv(xb), conv(ids), conv(w))
            y = v.x.clone() if kind == "torch" else v.x.copy()
            moe.combine(y)
    # combine with a bad y or out on one rank: the same error everywhere,
    # and the dispatch stays for the combine again with good ones
    # (combine_send takes no out)
    def zeros(rows, cols, dt=torch.bfloat16):
        return conv(torch.zeros(rows, cols, dtype=dt))
    bad_combine = [
        ("y columns", lambda r: (zeros(r, H + 1), zeros(4, H)), "shape"),
        ("y rows", lambda r: (zeros(r + 1, H), zeros(4, H)), "shape"),
        ("y dtype", lambda r: (zeros(r, H, torch.float32), zeros(4, H)),
         "dtype"),
        ("y in-row stride", lambda r: (zeros(r, 2 * H)[:, ::2], zeros(4, H)),
         "contiguous"),
        ("out dtype", lambda r: (zeros(r, H), zeros(4, H, torch.float32)),
         "dtype"),
        ("out rows", lambda r: (zeros(r, H), zeros(5, H)), "shape"),
        ("out in-row stride", lambda r: (zeros(r, H), zeros(4, 2 * H)[:, ::2]),
         "contiguous")]
    if kind == "torch":
        bad_combine += [
            ("y neg view", lambda r: (torch._neg_view(zeros(r, H)),
                                      zeros(4, H)), "negative"),
            ("out neg view", lambda r: (zeros(r, H),
                                        torch._neg_view(zeros(4, H))),
             "negative"),
            ("y sparse", lambda r: (zeros(r, H).to_sparse(), zeros(4, H)),
             "sparse")]
    for half in (False, True):
        for name, make, text in bad_combine:
            if half and name.startswith("out"):
                continue
            v = moe.dispatch(conv(xb), conv(ids), conv(w))
            y = v.x.clone() if kind == "torch" else v.x.copy()
            bad, bad_out = make(v.rows) if me == bad_rank else \
                (y, zeros(4, H))
            with pytest.raises(fabep.InvalidArgumentError) as ei:
                if half:
                    moe.combine_send(bad)
                    moe.combine_recv()
                else:
                    moe.combine(bad, out=bad_out)
            if me == bad_rank:
                assert text in str(ei.value), (name, str(ei.value))
            out = moe.combine(y)
            assert out.shape[0] == 4
    # combine_recv's output is checked on this rank alone, before
    # anything is consumed: the combine stays pending, a retry works
    v = moe.dispatch(conv(xb), conv(ids), conv(w))
    moe.combine_send(v.x.clone() if kind == "torch" else v.x.copy())
    with pytest.raises(fabep.InvalidArgumentError, match="out"):
        moe.combine_recv(out=conv(torch.zeros(4, H)))
    out = moe.combine_recv()
    assert out.shape[0] == 4
    # a tensor on another device
    if kind == "torch":
        args = (torch.empty(4, H, dtype=torch.bfloat16, device="meta"),
                ids, w) if me == bad_rank else (xb, ids, w)
        with pytest.raises(fabep.InvalidArgumentError) as ei:
            moe.dispatch(*args)
        if me == bad_rank:
            assert "device" in str(ei.value)
    # allreduce: a bad input on one rank
    ar = fabep.AllReduce(comm, 8, H, "fp32")
    a = torch.ones(4, H)
    for bad in (a.bfloat16(), torch.ones(H, 4).t(), a.reshape(-1),
                torch.ones(4, H + 1)):
        arg = conv(bad) if me == bad_rank else conv(a)
        with pytest.raises(fabep.InvalidArgumentError):
            ar.allreduce(arg)
    assert float((ar.allreduce(conv(a)))[0, 0]) == nranks
    comm.close()
    return len(seen)


@pytest.mark.parametrize("nranks,bad_rank,kind", [(1, 0, "torch"),
                                                  (3, 1, "torch"),
                                                  (2, 1, "numpy")])
def test_bad_input_same_error_everywhere(nranks, bad_rank, kind):
    # 8 cases, 4 more of torch alone, each by the whole call and halves
    assert ranks.run(nranks, _quiet_refusals(_bad_body), kind, bad_rank,
                     timeout=90) == \
        [24 if kind == "torch" else 16] * nranks


def _lost_body(me, nranks, mode, pidfile):
    import time
    import fabep
    comm = fabep.Comm.from_env()
    moe = fabep.MoE(comm, E, K, H, MAXT)
    comm.barrier()
    if me == 1:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "stop":  # resumed by rank 0 once the others gave up
            with open(pidfile, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3.0)  # past the others' timeout: they give up on it
        comm._h = None   # its peers are gone: no collective destroy
        return None
    x, ids, w = tokens(me, 4, H, E, K, 5)
    with pytest.raises(fabep.FabepError) as ei:
        moe.dispatch(x.bfloat16(), ids, w)
    if mode == "kill":
        # a lost rank leaves the communicator unusable: refused at once
        t0 = time.monotonic()
        with pytest.raises(fabep.PeerLostError) as bi:
            comm.barrier()
        assert time.monotonic() - t0 < 0.5
        assert "communicator is unusable" in str(bi.value), str(bi.value)
    comm._h = None
    stopped = None
    if mode == "stop":
        with open(pidfile) as f:
            stopped = int(f.read())
        if me == 0:
            time.sleep(1.0)  # rank 2's wait ends too
            os.kill(stopped, signal.SIGCONT)
    return type(ei.value).__name__, ei.value.code, str(ei.value), stopped


@pytest.mark.parametrize("mode,cls", [("kill", "PeerLostError"),
                                      ("stall", "TimeoutError"),
                                      ("stop", "TimeoutError")])
def test_lost_rank_is_named(mode, cls, tmp_path):
    """A killed rank: PeerLostError; a rank that stops answering:
    TimeoutError; on every other rank, with a message naming rank 1,
    which says so when that rank's process is stopped (SIGSTOP)."""
    res = ranks.run(3, _lost_body, mode, str(tmp_path / "pid"),
                    env={"FABEP_TIMEOUT_MS": "1500"},
                    allow_killed=True, timeout=60)
    if mode == "kill":
        assert isinstance(res[1], ranks.Killed)
    for r in (0, 2):
        name, code, msg, stopped = res[r]
        assert name == cls, msg
        assert "rank 1" in msg or "ranks 1" in msg or "peer 1" in msg, msg
        if stopped:
            assert "rank 1 (process %d on this host) is stopped" % stopped \
                in msg, msg


def _readonly(shape):
    v = np.ones(shape, dtype=np.float32)
    v.flags.writeable = False
    return v


def _ar_refuse_body(me, nranks):
    """Each allreduce call refused on rank 1 (x, gamma, out, residual and
    scales of a wrong dtype, shape, device or layout, x not a tensor,
    eps not a number, a read-only residual or scales, which the library
    writes), with inputs above the
    log-step threshold, where every other rank takes the two-stage path:
    the refusal must take it too, else the handle is unusable."""
    import fabep
    comm = fabep.Comm.from_env()
    rows, cols = 8, 4096  # 128 KiB of fp32 a rank
    ar = fabep.AllReduce(comm, rows, cols, "fp32")
    a, g = torch.ones(rows, cols), torch.ones(cols)
    assert float(ar.allreduce(a)[0, 0]) == nranks
    calls = {
        "plain": lambda x, g_, o, kw: ar.allreduce(x, out=o),
        "rmsnorm": lambda x, g_, o, kw: ar.allreduce_rmsnorm(x, g_, out=o,
                                                             **kw),
        "fp8": lambda x, g_, o, kw: ar.allreduce_rmsnorm_fp8(x, g_, out=o,
                                                             **kw),
    }
    def strided(*shape, dtype=torch.float32):  # every other value
        return torch.ones(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]

    def out_dt(c):
        return torch.uint8 if c == "fp8" else torch.float32
    # (name, arguments for call c, what the refusing rank's message
    # names); the strided tensors and out=x are for the fast path's checks
    bads = [("dtype_x", lambda c: (a.bfloat16(), g, None, {}), "x"),
            ("list_x", lambda c: (a.tolist(), g, None, {}), "x"),
            ("device_x", lambda c: (a.to("meta"), g, None, {}), "device"),
            ("sparse_x", lambda c: (a.to_sparse(), g, None, {}),
             "sparse_coo"),
            ("neg_x", lambda c: (torch._neg_view(a), g, None, {}),
             "negative or conjugate"),
            ("neg_gamma", lambda c: (a, torch._neg_view(g), None, {}),
             "gamma: a view with torch's negative"),
            ("sparse_out", lambda c: (
                a, g, torch.zeros(rows, cols, dtype=out_dt(c)).to_sparse(),
                {}), "out: a torch.sparse_coo"),
            ("neg_residual", lambda c: (
                a, g, None, {"residual": torch._neg_view(torch.ones(rows,
                                                                    cols))}),
             "residual: a view with torch's negative"),
            ("strided_x", lambda c: (strided(rows, cols), g, None, {}),
             "contiguous"),
            ("gamma", lambda c: (a, torch.ones(cols + 1), None, {}),
             "gamma"),
            ("gamma_dtype", lambda c: (a, g.double(), None, {}), "gamma"),
            ("gamma_device", lambda c: (a, g.to("meta"), None, {}),
             "gamma: tensor on device meta"),
            ("gamma_strided", lambda c: (a, strided(cols), None, {}),
             "gamma: not contiguous"),
            ("out", lambda c: (a, g, torch.empty(rows, cols,
                                                 dtype=torch.float64), {}),
             "out"),
            ("out_strided", lambda c: (
                a, g, strided(rows, cols, dtype=out_dt(c)), {}),
             "out: not contiguous"),
            ("out_rows", lambda c: (
                a, g, torch.empty(rows - 1, cols, dtype=out_dt(c)), {}),
             "out: shape"),
            ("out_x", lambda c: (a, g, a, {}), "out: dtype"),
            ("eps", lambda c: (a, g, None, {"eps": None}), "eps"),
            ("residual", lambda c: (a, g, None,
                                    {"residual": _readonly((rows, cols))}),
             "residual"),
            ("residual_strided", lambda c: (
                a, g, None, {"residual": strided(rows, cols)}),
             "residual: not contiguous"),
            ("scales", lambda c: (a, g, None, {"scales": _readonly(rows)}),
             "scales"),
            ("scales_strided", lambda c: (
                a, g, None, {"scales": strided(rows)}),
             "scales: not contiguous")]
    seen = 0
    for cname, call in calls.items():
        for bname, make, text in bads:
            if cname == "plain" and bname.startswith(
                    ("gamma", "eps", "residual", "neg_gamma",
                     "neg_residual")):
                continue
            if cname != "fp8" and bname in ("scales", "scales_strided",
                                            "out_x"):
                continue
            args = make(cname) if me == 1 else (a, g, None, {})
            with pytest.raises(fabep.InvalidArgumentError) as ei:
                call(*args)
            if me == 1:
                assert text in str(ei.value), (cname, bname, str(ei.value))
            # the handle works again on every rank
            assert float(ar.allreduce(a)[0, 0]) == nranks, (cname, bname)
            seen += 1
    comm.close()
    return seen


def test_allreduce_refusal_keeps_the_handle():
    """From 4 ranks: a refusal above the log-step threshold."""
    assert ranks.run(4, _quiet_refusals(_ar_refuse_body)) == [51] * 4


def _moe_args_body(me, nranks):
    """The MoE handle's own argument checks, on rank 1: refusals that
    reach every rank (x None with tokens, scales for bf16 tokens,
    weights without ids, fp8_prequant without scales), those that stay
    on the rank (a second send half), a row callback that raises; the
    handle works after each."""
    import fabep
    comm = fabep.Comm.from_env()
    moe = fabep.MoE(comm, E, K, H, MAXT)
    x, ids, w = tokens(me, 4, H, E, K, 5)
    xb = x.bfloat16()

    def works():
        # the rows back unchanged: each token's weighted sum of itself
        v = moe.dispatch(xb, ids, w)
        out = moe.combine(v.x.clone()).float()
        ref = ((ids >= 0).float() * w).sum(1, keepdim=True) * xb.float()
        assert ((out - ref).abs() <= 2.0 ** -6 * ref.abs() + 1e-3).all()

    cases = [("x None", lambda: (None, ids, w, None), "None with 4 tokens"),
             ("scales", lambda: (xb, ids, w, torch.ones(4, 1)),
              "only fp8_prequant"),
             ("weights", lambda: (xb, None, w, None),
              "topk_weights without topk_ids")]
    for name, make, text in cases:
        args = make() if me == 1 else (xb, ids, w, None)
        with pytest.raises(fabep.InvalidArgumentError) as ei:
            moe.dispatch(*args)
        if me == 1:
            assert text in str(ei.value), (name, str(ei.value))
        works()
    # a second send half while the first awaits its receive half: this
    # rank alone, nothing sent; the pending dispatch then completes
    moe.dispatch_send(xb, ids, w)
    if me == 1:
        with pytest.raises(fabep.InvalidArgumentError, match="awaits"):
            moe.dispatch_send(xb, ids, w)
    y = moe.dispatch_recv().x.clone()
    moe.combine_send(y)
    if me == 1:
        with pytest.raises(fabep.InvalidArgumentError, match="awaits"):
            moe.combine_send(y)
    moe.combine_recv()
    # a row callback that raises: the call completes everywhere, and
    # this rank raises the callback's exception after it
    v = moe.dispatch(xb, ids, w)
    seen = []

    def boom(token, row):
        seen.append(token)
        if me == 1:
            raise ZeroDivisionError("row %d" % token)
    if me == 1:
        with pytest.raises(ZeroDivisionError):
            moe.combine(v.x.clone(), row_callback=boom)
    else:
        moe.combine(v.x.clone(), row_callback=boom)
        assert sorted(seen) == list(range(4))
    works()
    # a dispatch refused in C (more than max_tokens on rank 1), by
    # halves: topk_ids None then reuses the last accepted dispatch's
    # routing on every rank, not the refused one's
    big = torch.zeros(MAXT + 1, H, dtype=torch.bfloat16)
    bigids = torch.zeros(MAXT + 1, K, dtype=torch.int32)
    if me == 1:
        with pytest.raises(fabep.FabepError, match="max_tokens"):
            moe.dispatch_send(big, bigids)
    else:
        moe.dispatch_send(xb[:2], ids[:2], w[:2])
        with pytest.raises(fabep.FabepError):
            moe.dispatch_recv()
    v = moe.dispatch(xb, None)
    out = moe.combine(v.x.clone()).float()
    ref = ((ids >= 0).float() * w).sum(1, keepdim=True) * xb.float()
    assert ((out - ref).abs() <= 2.0 ** -6 * ref.abs() + 1e-3).all()
    moe.close()
    # fp8_prequant without its scales on one rank
    q = fabep.MoE(comm, E, K, H, MAXT, token_type="fp8_prequant")
    codes = torch.zeros(4, H, dtype=torch.uint8)
    sc = torch.ones(4, 1)
    with pytest.raises(fabep.InvalidArgumentError) as ei:
        q.dispatch(codes, ids, w, None if me == 1 else sc)
    if me == 1:
        assert "fp8_prequant needs" in str(ei.value)
    v = q.dispatch(codes, ids, w, sc)
    q.combine(torch.zeros(v.rows, H).bfloat16())
    q.close()
    # the heap a configuration takes grows with the ranks and its rows
    b = fabep.MoE.heap_bytes(nranks, E, K, H, MAXT)
    assert 0 < b < fabep.MoE.heap_bytes(nranks + 1, E, K, H, MAXT)
    assert b < fabep.MoE.heap_bytes(nranks, E, K, 2 * H, MAXT)
    assert fabep.MoE.heap_bytes(nranks, E, K, H, MAXT, output="numpy") == b
    comm.close()
    return True


def test_moe_argument_checks():
    assert all(ranks.run(2, _moe_args_body))


def _text_body(me, nranks):
    import ctypes
    import tempfile
    import fabep
    libc = ctypes.CDLL(None)
    before = ctypes.c_void_p.in_dll(libc, "stderr").value
    comm = fabep.Comm.from_env()
    moe = fabep.MoE(comm, E, K, H, MAXT)
    x, ids, w = tokens(me, 4, H, E, K, 5)
    xb = x.bfloat16()
    bad = _oob(ids) if me == 1 else ids
    # the library prints to fd 2 itself, and the exception says why too
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            with pytest.raises(fabep.RangeError) as ei:
                moe.dispatch(xb, bad, w)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        printed = f.read().decode(errors="replace")
    first = str(ei.value)
    # refused in Python (dtype on rank 1): no C text, none of the last one
    with pytest.raises(fabep.InvalidArgumentError) as ei:
        moe.dispatch(x if me == 1 else xb, ids, w)
    refused = str(ei.value)
    # the next C failure carries its own messages only
    with pytest.raises(fabep.RangeError) as ei:
        moe.dispatch(xb, bad, w)
    again = str(ei.value)
    v = moe.dispatch(xb, ids, w)
    moe.combine(v.x.clone())
    comm.close()
    untouched = ctypes.c_void_p.in_dll(libc, "stderr").value == before
    return untouched, printed, first, refused, again


def test_error_text_from_the_library():
    """The exception carries the library's messages of its own failure
    (fabep_last_error) and of no other; C's stderr is left alone."""
    res = ranks.run(2, _text_body, timeout=60)
    for me, (untouched, printed, first, refused, again) in enumerate(res):
        why = "expert id" if me == 1 else "rank 1 rejected its input"
        assert untouched, "C stderr was redirected"
        assert why in printed, printed
        assert first.count(why) == 1, first
        assert again.count(why) == 1, again
        assert "expert id" not in refused, refused
        assert "out of range" not in refused, refused
        assert "NULL tokens" not in refused + again, (refused, again)


def test_error_classes():
    import errno
    import fabep
    from fabep.errors import error_class
    assert error_class(-errno.EINVAL) is fabep.InvalidArgumentError
    assert error_class(-errno.ETIMEDOUT) is fabep.TimeoutError
    assert issubclass(fabep.TimeoutError, TimeoutError)
    assert issubclass(fabep.InvalidArgumentError, ValueError)
    assert error_class(-10007) is fabep.HeapFullError
    assert error_class(-10008) is fabep.BusyError
    e = fabep.FabepError(-errno.ETIMEDOUT)
    assert e.code == -errno.ETIMEDOUT and "timed out" in str(e)


def _create_refused_body(me, nranks, what):
    """A constructor argument refused in Python on rank 1 only: every
    rank raises at once (the C create fails on every rank), none waits
    for the timeout, and the communicator still works."""
    import time
    import fabep
    bad = me == 1
    if what == "comm":
        t0 = time.monotonic()
        try:
            fabep.Comm(signal="ordred" if bad else None)
        except fabep.FabepError as e:
            err = e
        else:
            raise AssertionError("Comm was created")
        dt = time.monotonic() - t0
        assert dt < 10, dt
        if bad:
            assert isinstance(err, fabep.InvalidArgumentError), err
            assert "ordred" in str(err)
        return type(err).__name__
    comm = fabep.Comm(heap_size=64 << 20)
    t0 = time.monotonic()
    try:
        if what == "moe":
            fabep.MoE(comm, E, K, H, MAXT,
                      token_type="bogus" if bad else "bf16")
        elif what == "moe_size":
            fabep.MoE(comm, E, K, "32" if bad else H, MAXT)
        elif what == "moe_output":
            fabep.MoE(comm, E, K, H, MAXT,
                      output="tensorflow" if bad else None)
        elif what == "moe_type":  # not even hashable
            fabep.MoE(comm, E, K, H, MAXT,
                      token_type=["bf16"] if bad else "bf16")
        elif what == "allreduce_type":
            fabep.AllReduce(comm, 4, H, dtype=["fp32"] if bad else "fp32")
        else:
            fabep.AllReduce(comm, 4, H, dtype="fp16" if bad else "bf16")
    except fabep.FabepError as e:
        err = e
    else:
        raise AssertionError("%s was created" % what)
    dt = time.monotonic() - t0
    assert dt < 10, dt
    if bad:
        assert isinstance(err, fabep.InvalidArgumentError), err
    comm.barrier()
    moe = fabep.MoE(comm, E, K, H, MAXT)
    x, ids, w = tokens(me, 3, H, E, K, 5)
    moe.dispatch(x.bfloat16(), ids, w)
    moe.close()
    comm.close()
    return type(err).__name__


@pytest.mark.parametrize("what", ["comm", "moe", "moe_size", "moe_output",
                                  "moe_type", "allreduce", "allreduce_type"])
def test_create_refused_on_one_rank(what):
    res = ranks.run(2, _quiet_refusals(_create_refused_body), what,
                    env={"FABEP_TIMEOUT_MS": "30000"})
    assert res[1] == "InvalidArgumentError"
    assert res[0] in ("InvalidArgumentError", "PeerError"), res


class _Alarm(Exception):
    pass


def _interrupted_body(me, nranks, call):
    """A signal handler's exception raised as a dispatch or combine
    returns (rank 0's SIGALRM while it waits for a late rank 1): what
    that call did is unknown to the package, which then refuses the
    handle's calls rather than guess (a combine sized from a wrong guess
    would let the library write past its output); closing it works, and
    a new handle does."""
    import signal
    import fabep
    comm = fabep.Comm(heap_size=64 << 20)
    moe = fabep.MoE(comm, E, K, H, MAXT)
    x, ids, w = tokens(me, 4, H, E, K, 7)
    if call == "combine":
        v = moe.dispatch(x.bfloat16(), ids, w)
        y = v.x.clone()
    comm.barrier()
    if me == 0:
        def alarm(sig, frame):
            raise _Alarm()
        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            if call == "dispatch":
                moe.dispatch(x.bfloat16(), ids, w)
            else:
                moe.combine(y)
        except _Alarm:
            pass
        else:
            raise AssertionError("no alarm")
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        with pytest.raises(fabep.PeerLostError, match="unknown here"):
            moe.combine(torch.zeros(0, H, dtype=torch.bfloat16))
        with pytest.raises(fabep.PeerLostError, match="unusable"):
            moe.dispatch(x.bfloat16(), ids, w)
    else:
        time.sleep(1.0)
        if call == "dispatch":
            moe.dispatch(x.bfloat16(), ids, w)
        else:
            moe.combine(y)
    moe.close()
    comm.barrier()
    moe = fabep.MoE(comm, E, K, H, MAXT)
    v = moe.dispatch(x.bfloat16(), ids, w)
    out = moe.combine(v.x.clone())
    moe.close()
    comm.close()
    return tuple(out.shape)


@pytest.mark.parametrize("call", ["dispatch", "combine"])
def test_interrupted_call(call):
    assert ranks.run(2, _interrupted_body, call) == [(4, H), (4, H)]


def _sendbuf_body(me, nranks):
    """The send buffer is good for one call, through dispatch() as
    through dispatch_send(); a strided scales is taken only as the send
    buffer's own."""
    import fabep
    comm = fabep.Comm(heap_size=64 << 20)
    h = 48  # rows of the send buffer are padded beyond it
    moe = fabep.MoE(comm, E, K, h, MAXT)
    x, ids, w = tokens(me, 4, h, E, K, 3)
    sb, _ = moe.send_buffer()
    sb[:4] = x.bfloat16()
    v = moe.dispatch(sb[:4], ids, w)
    want = v.x.clone()
    y = moe.combine(v.x.clone())
    # the same view again: stale (its rows apart), refused
    with pytest.raises(fabep.InvalidArgumentError, match="contiguous"):
        moe.dispatch(sb[:4], ids, w)
    v = moe.dispatch(x.bfloat16(), ids, w)
    assert torch.equal(v.x, want)
    moe.combine(v.x.clone())
    assert y.shape == (4, h)
    moe.close()

    q = fabep.MoE(comm, E, K, 32, MAXT, token_type="fp8_prequant")
    codes = torch.randint(0, 0x70, (4, 32), dtype=torch.uint8)
    wide = torch.arange(1, 9, dtype=torch.float32).reshape(4, 2)
    q.send_buffer()
    with pytest.raises(fabep.InvalidArgumentError, match="contiguous"):
        q.dispatch(codes, ids, w, scales=wide[:, :1])
    v = q.dispatch(codes, ids, w, scales=wide[:, :1].contiguous())
    got = v.scales.flatten().tolist()
    assert set(got) <= {1.0, 3.0, 5.0, 7.0}, got
    q.combine(torch.zeros(v.rows, 32, dtype=torch.bfloat16))
    q.close()
    comm.close()
    return True


def test_send_buffer_for_one_call():
    assert ranks.run(1, _sendbuf_body) == [True]


def _scales_empty_body(me, nranks):
    """An FP8 receive view of no rows still has scales, of 0 rows."""
    import fabep
    comm = fabep.Comm(heap_size=64 << 20)
    moe = fabep.MoE(comm, 4, 1, 32, 4, token_type="fp8", fp8_block=16)
    x = torch.randn(2, 32)
    # every token to expert 0, which rank 0 holds: rank 1 gets no rows
    ids = torch.zeros(2, 1, dtype=torch.int32)
    v = moe.dispatch(x.bfloat16(), ids)
    rows, shape = v.rows, tuple(v.scales.shape)
    moe.combine(torch.zeros(v.rows, 32, dtype=torch.bfloat16))
    moe.close()
    comm.close()
    return rows, shape


def test_fp8_scales_with_no_rows():
    assert ranks.run(2, _scales_empty_body) == [(4, (4, 2)), (0, (0, 2))]


def _python_args_body(me, nranks):
    """Arguments refused before the C call, with the package's class."""
    import fabep
    comm = fabep.Comm(heap_size=16 << 20, numa_node=None)
    blk = comm.heap_alloc(64)
    sig = comm.heap_alloc(8)
    bad = [
        lambda: blk.numpy("float32"),
        lambda: blk.torch(torch.float32),
        lambda: comm.heap_alloc(-1),
        lambda: comm.heap_alloc(1.5),
        lambda: comm.put(0, 1.7, blk, 8),
        lambda: comm.put(0, blk, blk, -8),
        lambda: comm.put_signal(-1, blk, blk, 8, sig),
        lambda: comm.wait(sig, -1),
        lambda: fabep.providers(max_count=0),
        lambda: fabep.AllReduce.heap_bytes(1, 4, 32, "fp16"),
        lambda: fabep.AllReduce.heap_bytes(1, -4, 32),
        # values ctypes would wrap around without a word
        lambda: comm.put(2**32, blk, blk, 8),
        lambda: comm.put(0, 2**64, blk, 8),
        lambda: comm.put(0, blk, blk, 2**64),
        lambda: comm.wait(sig, 2**64),
        lambda: comm.heap_alloc(2**64 + 8),
        lambda: fabep.AllReduce.heap_bytes(1, 2**64 + 4, 32),
        lambda: fabep.AllReduce.heap_bytes(2**32 + 1, 4, 32),
        lambda: fabep.AllReduce.heap_bytes(-1, 4, 32),
        lambda: fabep.MoE.heap_bytes(1, E, K, 2**64 + H, MAXT),
        lambda: fabep.MoE.heap_bytes(-1, E, K, H, MAXT),
        lambda: fabep.MoE.heap_bytes(2.5, E, K, H, MAXT),
        lambda: fabep.strerror(2**40),
        lambda: fabep.shm_cleanup(1.5),
        lambda: fabep.shm_cleanup(True),
        lambda: fabep.shm_cleanup(2**64 + os.getpid()),
        lambda: fabep.Comm(allgather=lambda d: d, rank=0, size=1,
                           heap_size=2**64 + 2**20),
        lambda: fabep.Comm(allgather=lambda d: d, rank=0, size=1,
                           timeout_ms=2**32 + 5),
        lambda: fabep.Comm(allgather=lambda d: d, rank=0, size=1,
                           signal=2**32 + 1),
        lambda: fabep.Comm(allgather=lambda d: d, rank=2**32, size=1),
        lambda: fabep.Comm(allgather=lambda d: d, rank=0.0, size=1),
        lambda: fabep.MoE(comm, 2**32 + 4, K, H, MAXT),
        lambda: fabep.MoE(comm, E, K, 2**64 + H, MAXT),
        lambda: fabep.AllReduce(comm, 2**64 + 4, 32),
    ]
    for i, f in enumerate(bad):
        with pytest.raises(fabep.InvalidArgumentError):
            f()
    with pytest.raises(fabep.InvalidArgumentError, match="allgather"):
        fabep.Comm(rank=0, size=1)
    # an allgather that returns no bytes: the callback's TypeError is
    # the cause of the create's error
    with pytest.raises(fabep.FabepError) as e:
        fabep.Comm(allgather=lambda d: "x" * len(d), rank=0, size=1)
    assert isinstance(e.value.__cause__, TypeError)
    moe = fabep.MoE(comm, E, K, H, MAXT)
    with pytest.raises(fabep.InvalidArgumentError, match="kind"):
        moe.send_buffer("bogus")
    with pytest.raises(fabep.InvalidArgumentError, match="there was none"):
        moe.combine_backward(torch.zeros(2, H, dtype=torch.bfloat16))
    moe.close()
    comm.put(0, blk, blk, 8)  # still usable
    comm.flush()
    comm.close()
    return True


def test_python_side_argument_checks():
    assert ranks.run(1, _python_args_body) == [True]
