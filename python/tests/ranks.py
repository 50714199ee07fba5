# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""Run a test function on N ranks: forked processes, each with its own
fabep communicator (the pytest process itself never opens the fabric,
so forking it is safe), results and exceptions sent back by pipe, and a
timeout after which every rank is killed and the test fails."""
import os
import pickle
import signal
import socket
import time
import traceback


class Killed:
    """The result of a rank that died by a signal."""

    def __init__(self, sig):
        self.sig = sig

    def __repr__(self):
        return "Killed(%d)" % self.sig


class RankFailed(AssertionError):
    pass


def _port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _cleanup(pid):
    """The shm regions a reaped rank left (killed, or gone without
    closing its communicator)."""
    import fabep
    fabep.shm_cleanup(pid)


def run(n, fn, *args, timeout=60, env=None, allow_killed=False):
    """fn(rank, n, *args) on n ranks; returns the list of results.  A
    rank that raises fails the test with its traceback."""
    root = "127.0.0.1:%d" % _port()
    kids = []
    for r in range(n):
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            code = 0
            try:
                os.environ.update(FABEP_RANK=str(r), FABEP_WORLD_SIZE=str(n),
                                  FABEP_ROOT=root)
                os.environ.update(env or {})
                try:
                    res = ("ok", fn(r, n, *args))
                except BaseException as e:  # noqa: B902 - sent to the parent
                    res = ("err", "%s: %s" % (type(e).__name__, e),
                           traceback.format_exc())
                try:
                    data = pickle.dumps(res)
                except Exception:
                    data = pickle.dumps(("ok", repr(res[1])))
                with os.fdopen(wfd, "wb") as f:
                    f.write(data)
            except BaseException:  # noqa: B902
                code = 3
            finally:
                os._exit(code)
        os.close(wfd)
        kids.append((pid, rfd))
    out = [None] * n
    bufs = [b""] * n
    done = [False] * n
    deadline = time.monotonic() + timeout
    try:
        while not all(done):
            for r, (pid, rfd) in enumerate(kids):
                if done[r]:
                    continue
                wpid, st = os.waitpid(pid, os.WNOHANG)
                if wpid:
                    with os.fdopen(rfd, "rb") as f:
                        bufs[r] = f.read()
                    done[r] = True
                    _cleanup(pid)
                    if os.WIFSIGNALED(st):
                        out[r] = Killed(os.WTERMSIG(st))
                    elif bufs[r]:
                        out[r] = pickle.loads(bufs[r])
                    else:
                        out[r] = ("err", "exited %d" % os.WEXITSTATUS(st), "")
            if all(done):
                break
            if time.monotonic() > deadline:
                raise RankFailed("ranks %s still running after %g s" % (
                    [r for r in range(n) if not done[r]], timeout))
            time.sleep(0.01)
    finally:
        for r, (pid, rfd) in enumerate(kids):
            if not done[r]:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    os.close(rfd)
                except OSError:
                    pass
                _cleanup(pid)
    results, errs = [], []
    for r, o in enumerate(out):
        if isinstance(o, Killed):
            if not allow_killed:
                errs.append("rank %d killed by signal %d" % (r, o.sig))
            results.append(o)
        elif o[0] == "err":
            errs.append("rank %d: %s\n%s" % (r, o[1], o[2]))
        else:
            results.append(o[1])
    if errs:
        # every failed rank's story, the cause first: a rank whose peer
        # failed reports only that it lost it
        errs.sort(key=lambda e: "PeerLostError" in e.split("\n")[0])
        raise RankFailed("\n".join(errs))
    return results
