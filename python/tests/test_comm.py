# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""The communicator: bootstrap from the environment, torchrun's variables
and a torch.distributed group; the heap and one-sided calls; the GIL."""
import errno
import os
import threading
import time

import numpy as np
import pytest
import torch

import ranks


def test_library_queries():
    import fabep
    assert fabep.version().count(".") == 2
    assert fabep.isa() in ("scalar", "avx2", "avx512")
    assert "shm" in [p["provider"] for p in fabep.providers("shm")]
    # every strategy by its name, shm's default (often cma) included
    for p in fabep.providers():
        assert p["signal"] in fabep._lib.SIGNALS, p
    assert fabep.strerror(-110)


_SIGNALS = r"""
import os, signal, sys, time
import fabep
if sys.argv[1] == "comm":
    comm = fabep.Comm.from_env()
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    print("no KeyboardInterrupt")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
"""


@pytest.mark.parametrize("when", ["import", "comm"])
def test_signals_kept(when, sigint_default):
    """Neither loading the library (whose libfabric may load
    libinfinipath, which takes SIGINT, SIGTERM, ... with handlers that
    call exit(1)) nor opening a communicator takes the interpreter's
    signals: Ctrl-C still raises KeyboardInterrupt, SIGTERM still ends
    the process by the signal."""
    import signal
    import subprocess
    import sys
    import fabep
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(fabep.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        [pkg] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for k in ("FABEP_RANK", "FABEP_WORLD_SIZE", "FABEP_ROOT"):
        env.pop(k, None)
    p = subprocess.Popen([sys.executable, "-c", _SIGNALS, when], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.wait()
        # a process that ends by a signal leaves its shm regions
        fabep.shm_cleanup(p.pid)
    out = out.decode()
    assert out.strip() == "KeyboardInterrupt", (out, err.decode())
    assert p.returncode == -signal.SIGTERM, (p.returncode, err.decode())


def _heap_body(me, n, kind):
    import fabep
    with fabep.Comm.from_env() as comm:
        assert (comm.rank, comm.size) == (me, n)
        assert comm.provider == "shm" and comm.heap_size > 0
        comm.barrier()
        data = comm.heap_alloc(64 * 4)
        recv = comm.heap_alloc(64 * 4 * n)
        sig = comm.heap_alloc(8, 8)
        mine = data.numpy("fp32") if kind == "numpy" else data.torch("fp32")
        mine[:] = (np.arange(64) + 1000 * me) if kind == "numpy" else \
            torch.arange(64).float() + 1000 * me
        # every rank writes its block into slot `me` of every peer, then
        # signals; then waits for n - 1 signals
        for rounds in (1, 2):
            for p in range(n):
                if p != me:
                    comm.put_signal(p, recv.offset + me * 256, data, 256, sig)
            comm.flush()
            comm.wait(sig, (n - 1) * rounds)
            assert comm.counter(sig) >= (n - 1) * rounds
            got = recv.numpy("fp32").reshape(n, 64)
            for p in range(n):
                if p != me:
                    assert (got[p] == np.arange(64) + 1000 * p).all()
            comm.barrier()
        # plain put, then a barrier orders it for the reader
        if n > 1:
            comm.put((me + 1) % n, recv.offset, data, 4)
            comm.flush()
            comm.barrier()
            assert recv.numpy("fp32")[0] == 1000 * ((me - 1) % n)
        # get: read the left neighbour's block (its values, not ours)
        # and this rank's own, into the receive area, then a range that
        # leaves the peer's heap
        left = (me - 1) % n
        comm.get(left, recv.offset, data, 256)
        comm.get(me, recv.offset + 256 if n > 1 else recv.offset, data, 256)
        comm.flush()
        got = recv.numpy("fp32")
        assert (got[:64] == np.arange(64) + 1000 * (left if n > 1 else me)).all()
        assert (got[64 * (n > 1):64 * (n > 1) + 64] == np.arange(64) + 1000 * me).all()
        with pytest.raises(fabep.FabepError) as e:
            comm.get(left, recv, comm.heap_size - 8, 64)
        assert e.value.code == -34  # -ERANGE
        comm.barrier()
        with pytest.raises(fabep.InvalidArgumentError):
            comm.heap_alloc(8, align=3)
        with pytest.raises(fabep.HeapFullError):
            comm.heap_alloc(1 << 40)
        comm.progress()
    return True


@pytest.mark.parametrize("n,kind", [(1, "numpy"), (2, "torch"), (4, "numpy")])
def test_heap_put_signal_wait(n, kind):
    assert all(ranks.run(n, _heap_body, kind))


def _gil_body(me, n):
    """While rank 0 waits in a barrier that rank 1 enters late, another
    Python thread of rank 0 runs: the foreign call released the GIL."""
    import fabep
    comm = fabep.Comm.from_env()
    comm.barrier()
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)
    if me == 0:
        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.05)
        before = ticks[0]
        comm.barrier()
        during = ticks[0] - before
        stop.set()
        t.join()
    else:
        time.sleep(1.0)
        comm.barrier()
        during = None
    comm.close()
    return during


def test_gil_released_during_waits():
    res = ranks.run(2, _gil_body)
    assert res[0] > 100, res  # about 1 s of 1 ms ticks ran meanwhile


def _one_thread_body(me, n):
    """While a thread of rank 0 waits on the communicator, its other
    thread's calls on it and on its handles raise InUseError at once;
    queries still answer; after the wait the other thread may go on."""
    import fabep
    comm = fabep.Comm.from_env()
    sig = comm.heap_alloc(8)
    ar = fabep.AllReduce(comm, 4, 8, "fp32")
    comm.barrier()
    if me == 0:
        errs = []
        t = threading.Thread(target=lambda: errs.append(comm.wait(sig, 1)))
        t.start()
        time.sleep(0.2)
        refused = []
        for call in (comm.barrier, comm.flush, comm.progress,
                     lambda: comm.heap_alloc(8),
                     lambda: comm.put_signal(1, sig, sig, 0, sig),
                     lambda: ar.allreduce(torch.ones(2, 8)),
                     lambda: fabep.AllReduce(comm, 4, 8, "fp32"),
                     lambda: fabep.MoE(comm, 4 * n, 2, 8, 4),
                     ar.close, comm.abort, comm.close):
            t0 = time.monotonic()
            with pytest.raises(fabep.InUseError) as e:
                call()
            assert time.monotonic() - t0 < 0.1
            assert "another thread" in str(e.value)
            assert e.value.code == -16  # -EBUSY
            refused.append(call)
        assert (comm.rank, comm.size) == (0, n) and comm.counter(sig) == 0
        t.join()
        assert errs == [None]
    else:
        time.sleep(1.0)
        comm.put_signal(0, sig, sig, 0, sig)
    out = ar.allreduce(torch.ones(2, 8))
    comm.barrier()
    comm.close()
    return float(out[0, 0])


def test_one_thread_at_a_time():
    assert ranks.run(2, _one_thread_body) == [2.0, 2.0]


def _pg_body(me, n, use_store, port):
    import torch.distributed as dist
    import fabep
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=me, world_size=n)
    for k in ("FABEP_RANK", "FABEP_WORLD_SIZE", "FABEP_ROOT"):
        os.environ.pop(k)
    comm = fabep.Comm.from_process_group(use_store=use_store)
    assert (comm.rank, comm.size) == (me, n)
    ar = fabep.AllReduce(comm, 4, 8, "fp32")
    out = ar.allreduce(torch.full((2, 8), float(me + 1)))
    comm.close()
    dist.destroy_process_group()
    return float(out[0, 0])


@pytest.mark.parametrize("use_store", [False, True])
def test_from_process_group(use_store):
    n = 3
    res = ranks.run(n, _pg_body, use_store, ranks._port())
    assert res == [float(n * (n + 1) / 2)] * n


def _torchrun_body(me, n, port, slurm=False, env=None, torch_after=False):
    import fabep
    for k in ("FABEP_RANK", "FABEP_WORLD_SIZE", "FABEP_ROOT"):
        os.environ.pop(k)
    os.environ.update(RANK=str(me), WORLD_SIZE=str(n),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(env or {})
    if slurm:
        # torchrun started by srun: one task of one, whose variables
        # every worker inherits
        os.environ.update(TORCHELASTIC_RUN_ID="t1", SLURM_PROCID="0",
                          SLURM_NTASKS="1")
    comms = [fabep.Comm.from_env() for _ in range(2 if torch_after else 1)]
    r = (comms[0].rank, comms[0].size)
    if torch_after:
        # the server's own torch.distributed, on the same MASTER_PORT
        import torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == n
    for c in comms:
        c.barrier()
        c.close()
    return r


def test_from_torchrun_env():
    n = 2
    assert ranks.run(n, _torchrun_body, ranks._port()) == \
        [(r, n) for r in range(n)]


def test_from_torchrun_env_under_slurm():
    n = 2
    assert ranks.run(n, _torchrun_body, ranks._port(), True) == \
        [(r, n) for r in range(n)]


def test_from_torchrun_env_then_torch():
    """Two communicators from torchrun's variables, then
    init_process_group on the same MASTER_PORT (rank 0's store server
    is shared with torch's)."""
    n = 2
    assert ranks.run(n, _torchrun_body, ranks._port(), False, None, True) \
        == [(r, n) for r in range(n)]


_AGENT = """
import sys, torch.distributed as dist
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, True,
                  wait_for_workers=False)
# what an attempt cut short leaves: rank 1's block of the first
# allgather and its count, under each key layout fabep has used
for k in ("fabep/0/", "fabep/attempt_0/1/0/"):
    s.set(k + "1", b"left by attempt 0")
    s.add(k + "done", 1)
print("ready", flush=True)
sys.stdin.read()
"""


def test_from_torchrun_agent_store_restart():
    """Under torchrun's agent store (which outlives the workers), the
    workers of a restart ignore what the attempt before left there."""
    import subprocess
    import sys
    n, port = 2, ranks._port()
    agent = subprocess.Popen([sys.executable, "-c", _AGENT, str(port)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert agent.stdout.readline().strip() == b"ready"
        env = {"TORCHELASTIC_USE_AGENT_STORE": "True",
               "TORCHELASTIC_RESTART_COUNT": "1"}
        assert ranks.run(n, _torchrun_body, port, False, env) == \
            [(r, n) for r in range(n)]
    finally:
        agent.stdin.close()
        agent.wait(timeout=30)


def _cb_error_body(me, n):
    import fabep

    def bad(data):
        raise RuntimeError("control plane down")
    with pytest.raises(fabep.FabepError) as ei:
        fabep.Comm(allgather=bad, rank=me, size=n)
    assert isinstance(ei.value.__cause__, RuntimeError)
    return True


def test_allgather_callback_error():
    assert ranks.run(1, _cb_error_body) == [True]


def _closed_body(me, n):
    import fabep
    import torch
    with fabep.Comm.from_env() as comm:
        moe = fabep.MoE(comm, 4, 2, 32, 4)
        ar = fabep.AllReduce(comm, 4, 32, "fp32")
        for h in (moe, ar):
            h.close()
            h.close()  # twice: nothing more
        with pytest.raises(fabep.InvalidArgumentError,
                           match="the MoE handle is closed"):
            moe.dispatch(torch.zeros(1, 32, dtype=torch.bfloat16),
                         torch.zeros(1, 2, dtype=torch.int32),
                         torch.ones(1, 2))
        with pytest.raises(fabep.InvalidArgumentError,
                           match="the AllReduce handle is closed"):
            ar.allreduce(torch.zeros(1, 32))
        again = fabep.MoE(comm, 4, 2, 32, 4)  # the communicator still works
        comm.barrier()
    # the with-block closed the communicator and the handle made on it
    with pytest.raises(fabep.InvalidArgumentError,
                       match="the communicator is closed"):
        comm.barrier()
    assert again._h is None
    return True


def _cycle_body(me, n):
    """A communicator and its handles that only a reference cycle
    holds: the garbage collector clears the handles' weak references
    before any finalizer runs, and finalizes the communicator first;
    still each C handle is freed once, before the communicator.  A heap
    view asked of a closed communicator raises."""
    import gc
    import fabep
    lib = fabep._lib.lib
    freed = []

    def spy(name):
        real = getattr(lib, name)

        def call(h):
            freed.append((name, h))
            return real(h)
        setattr(lib, name, call)
        return real

    reals = {name: spy(name) for name in ("fabep_moe_destroy",
                                          "fabep_allreduce_destroy",
                                          "fabep_comm_destroy")}

    class Layer:
        pass

    gc.disable()
    try:
        layer = Layer()
        layer.comm = fabep.Comm.from_env()
        layer.moe = fabep.MoE(layer.comm, 4, 2, 32, 4)
        layer.ar = fabep.AllReduce(layer.comm, 4, 32, "fp32")
        layer.me = layer
        made = {"fabep_moe_destroy": layer.moe._h,
                "fabep_allreduce_destroy": layer.ar._h,
                "fabep_comm_destroy": layer.comm._h}
        del layer
        gc.collect()
    finally:
        gc.enable()
        for name, real in reals.items():
            setattr(lib, name, real)
    assert sorted(freed) == sorted(made.items()), freed
    assert freed[-1][0] == "fabep_comm_destroy", freed
    with fabep.Comm.from_env() as comm:
        blk = comm.heap_alloc(64)
    with pytest.raises(fabep.InvalidArgumentError,
                       match="the communicator is closed"):
        blk.numpy()
    return True


def test_handles_in_a_reference_cycle():
    assert ranks.run(2, _cycle_body) == [True, True]


def _cma_body(me, n):
    """signal="cma" is a strategy's name: granted, or refused by the
    provider (NoSignalError), never an invalid argument."""
    import fabep
    try:
        with fabep.Comm.from_env(signal="cma") as comm:
            return comm.signal
    except fabep.NoSignalError:
        return "refused"


def test_signal_cma():
    assert ranks.run(2, _cma_body) in (["cma", "cma"],
                                       ["refused", "refused"])


def _rdv_body(me, n):
    """rendezvous_timeout_ms bounds creation's rendezvous apart from the
    calls' timeout: rank 1 comes 1.5 s late, past timeout_ms (0.4 s),
    and is let in (rank 0 with a limit of 20 s, rank 1 with none); a
    value out of range is refused on every rank."""
    import time
    import fabep
    with pytest.raises(fabep.InvalidArgumentError,
                       match="rendezvous_timeout_ms"):
        fabep.Comm.from_env(rendezvous_timeout_ms=-2)
    if me == 1:
        time.sleep(1.5)
    with fabep.Comm.from_env(timeout_ms=400,
                             rendezvous_timeout_ms=-1 if me else 20000) as comm:
        comm.barrier()
    return True


def test_rendezvous_timeout():
    assert ranks.run(2, _rdv_body) == [True, True]


def _attr_body(me, n):
    """Comm's keyword arguments reach the library, its queries answer,
    the one-sided calls' errors arrive as their classes, and a wait that
    timed out leaves the communicator usable."""
    import time
    import fabep
    heap = 48 << 20
    with fabep.Comm.from_env(timeout_ms=700, heap_size=heap, threads=2,
                             signal="cqdata") as comm:
        assert comm.threads == 2
        assert comm.heap_size == heap
        assert comm.signal == "cqdata"
        assert comm.provider == "shm" and comm.domain
        assert comm.channels >= 1 and comm.numa_node >= -1
        assert repr(comm) == "<fabep.Comm rank %d of %d on shm>" % (me, n)
        blk = comm.heap_alloc(64)
        sig = comm.heap_alloc(8, 8)
        assert int(blk) == blk.offset and "nbytes=64" in repr(blk)
        with pytest.raises(fabep.InvalidArgumentError):
            comm.put(n, blk, blk, 8)          # no such rank
        with pytest.raises(fabep.RangeError):
            comm.put((me + 1) % n, comm.heap_size - 4, blk, 8)
        with pytest.raises(fabep.RangeError, match="not within one allocation"):
            comm.put((me + 1) % n, 0, blk, 8)  # the library's own words
        with pytest.raises(fabep.RangeError):
            comm.get((me + 1) % n, blk, blk.offset + 60, 8)  # two blocks
        assert comm.counter(0) == 0
        with pytest.raises(fabep.InvalidArgumentError, match="counter"):
            comm.put_signal((me + 1) % n, blk, blk, 8, comm.heap_size)
        with pytest.raises(fabep.InvalidArgumentError):
            comm.wait(comm.heap_size, 1)      # no counter there
        # nobody signals: the communicator's timeout, 0.7 s
        t0 = time.monotonic()
        with pytest.raises(fabep.TimeoutError):
            comm.wait(sig, 1)
        assert 0.5 < time.monotonic() - t0 < 5
        comm.flush()
        comm.barrier()
        comm.put_signal((me + 1) % n, blk, blk, 64, sig)
        comm.wait(sig, 1)
        comm.progress()
        comm.barrier()
    return True


def test_comm_attributes_and_one_sided_errors():
    assert all(ranks.run(2, _attr_body))


def _forked_body(me, n):
    """A child of fork() after the communicator was made: its calls on
    the communicator and its handles, close included, raise ForkedError
    at once, and their finalizers do nothing and say nothing; the parent
    and its peers go on as before."""
    import fabep
    comm = fabep.Comm.from_env(provider="shm", threads=1)
    ar = fabep.AllReduce(comm, 1, 64, "fp32")
    x = np.full((1, 64), me + 1, dtype=np.float32)
    comm.barrier()
    if me == 0:
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            said = []
            # the finalizers leave the parent's handles be, silently
            efd, err = os.pipe()
            old2 = os.dup(2)
            os.dup2(err, 2)
            ar.__del__()
            comm.__del__()
            os.dup2(old2, 2)
            os.close(err)
            with os.fdopen(efd, "rb") as f:
                logged = f.read().decode()
            if logged or comm._h is None or ar._h is None:
                said.append("finalizers: %r, closed: %s %s" % (
                    logged, comm._h is None, ar._h is None))
            for name, call in (("barrier", comm.barrier),
                               ("allreduce", lambda: ar.allreduce(x)),
                               ("AllReduce.close", ar.close),
                               ("close", comm.close)):
                try:
                    call()
                    said.append("%s: no error" % name)
                except fabep.ForkedError as e:
                    if e.code != -errno.EPERM or "fork()" not in str(e):
                        said.append("%s: %r" % (name, e))
                except BaseException as e:  # noqa: B902 - told the parent
                    said.append("%s: %r" % (name, e))
            os.write(wfd, "\n".join(said).encode())
            os._exit(0)
        os.close(wfd)
        with os.fdopen(rfd, "rb") as f:
            said = f.read().decode()
        os.waitpid(pid, 0)
        assert said == "", said
    for _ in range(3):
        out = ar.allreduce(x)
        assert np.array_equal(out, np.full((1, 64), n * (n + 1) / 2,
                                           dtype=np.float32))
        comm.barrier()
    comm.close()
    return True


def test_forked_child():
    assert ranks.run(2, _forked_body) == [True, True]


def test_closed_handles():
    """A closed handle refuses calls with InvalidArgumentError naming
    it; close() twice is harmless; a with-block closes the communicator
    and every handle made on it."""
    assert ranks.run(2, _closed_body) == [True, True]
