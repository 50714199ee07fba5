# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""python3 -m fabep.run: ranks see their variables; a failing rank stops
the others and the exit status says so; a timeout stops every rank."""
import errno
import os
import signal
import shutil
import socket
import subprocess
import sys
import time

import pytest

import fabep
import fabep.run as frun


def _env():
    """This environment, with the package under test on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(frun.__file__))] +
        env.get("PYTHONPATH", "").split(os.pathsep))
    return env


def _script(tmp_path, body):
    p = tmp_path / "prog.py"
    p.write_text(body)
    return str(p)


def test_ranks_and_comm(tmp_path):
    out = tmp_path / "out"
    prog = _script(tmp_path, """
import os, sys
import fabep
c = fabep.Comm.from_env()
c.barrier()
open(sys.argv[1] + str(c.rank), "w").write("%d %d %s" % (
    c.rank, c.size, os.environ["FABEP_LOCAL_SIZE"]))
c.close()
""")
    assert frun.launch(3, [prog, str(out)], env=_env()) == 0
    for r in range(3):
        assert (tmp_path / ("out%d" % r)).read_text() == "%d 3 3" % r


def test_binding(tmp_path):
    """Each rank runs on its own block of cores with as many threads,
    the blocks disjoint; FABEP_BIND=none and more ranks than cores leave
    them unbound with the library's default threads."""
    prog = _script(tmp_path, """
import os, sys
import fabep
c = fabep.Comm.from_env()
open(sys.argv[1] + str(c.rank), "w").write("%s;%d;%s" % (
    ",".join(map(str, sorted(os.sched_getaffinity(0)))), c.threads,
    os.environ.get("FABEP_THREADS", "")))
c.close()
""")
    mine = sorted(os.sched_getaffinity(0))
    cores = len({frun._core_key(c) for c in mine})
    env = _env()
    env.pop("FABEP_THREADS", None)
    env.pop("FABEP_BIND", None)
    n = min(cores, 2)
    assert frun.launch(n, [prog, str(tmp_path / "b")], env=env) == 0
    seen = set()
    for r in range(n):
        cpus, threads, var = (tmp_path / ("b%d" % r)).read_text().split(";")
        cpus = [int(x) for x in cpus.split(",")]
        assert cpus == frun.bind_sets(n, env)[r]
        assert not seen & set(cpus)
        seen |= set(cpus)
        assert int(threads) == len({frun._core_key(c) for c in cpus})
        assert var == threads
    # unbound: FABEP_BIND=none, and more ranks than cores
    for e, m in ((dict(env, FABEP_BIND="none"), n), (env, cores + 1)):
        assert frun.launch(m, [prog, str(tmp_path / "u")], env=e) == 0
        for r in range(m):
            cpus, threads, var = (tmp_path / ("u%d" % r)).read_text().split(
                ";")
            assert [int(x) for x in cpus.split(",")] == mine
            assert var == ""


def test_omp_threads(tmp_path):
    """OMP_NUM_THREADS, unless set, is each rank's share of the CPUs:
    its block's when bound, this process's CPUs over the ranks (at
    least 1) when not; a value given is passed on as it is."""
    prog = _script(tmp_path, """
import os, sys
open(sys.argv[1] + os.environ["FABEP_RANK"], "w").write(
    os.environ.get("OMP_NUM_THREADS", "unset"))
""")
    mine = sorted(os.sched_getaffinity(0))
    cores = len({frun._core_key(c) for c in mine})
    env = _env()
    env.pop("OMP_NUM_THREADS", None)
    env.pop("FABEP_BIND", None)

    def seen(n, e):
        assert frun.launch(n, [prog, str(tmp_path / "o")], env=e) == 0
        return [(tmp_path / ("o%d" % r)).read_text() for r in range(n)]

    n = min(cores, 2)
    assert seen(n, env) == [str(len(s)) for s in frun.bind_sets(n, env)]
    m = len(mine) + 1  # more ranks than CPUs: unbound, one thread each
    assert seen(m, env) == ["1"] * m
    assert seen(n, dict(env, FABEP_BIND="none")) == \
        [str(max(1, len(mine) // n))] * n
    assert seen(2, dict(env, OMP_NUM_THREADS="3")) == ["3", "3"]


def _regions(pid):
    return [f for f in os.listdir("/dev/shm") if f.startswith("%d:" % pid)]


def test_killed_rank_leaves_no_shm(tmp_path):
    """A rank killed after it made a communicator leaves shm regions;
    the launcher removes them, and the others' as it stops them."""
    prog = _script(tmp_path, """
import os, signal, sys, time
import fabep
c = fabep.Comm.from_env(provider="shm")
open(sys.argv[1] + os.environ["FABEP_RANK"], "w").write(str(os.getpid()))
c.barrier()
if os.environ["FABEP_RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
""")
    out = str(tmp_path / "pid")
    assert frun.launch(2, [prog, out], env=_env(), quiet=True) == 128 + 9
    for r in range(2):
        pid = int((tmp_path / ("pid%d" % r)).read_text())
        assert _regions(pid) == [], "rank %d (pid %d)" % (r, pid)
        assert fabep.shm_cleanup(pid) == 0


def test_shm_cleanup_refuses():
    """Not a pid, or a live process: refused, nothing removed."""
    with pytest.raises(fabep.InvalidArgumentError):
        fabep.shm_cleanup(0)
    with pytest.raises(fabep.FabepError) as e:
        fabep.shm_cleanup(os.getpid())
    assert e.value.code == -errno.EBUSY


def test_failure_stops_the_others(tmp_path):
    prog = _script(tmp_path, """
import os, sys, time
if os.environ["FABEP_RANK"] == "1":
    sys.exit(3)
time.sleep(60)
""")
    t0 = time.monotonic()
    assert frun.launch(3, [prog], quiet=True) == 3
    assert time.monotonic() - t0 < 20


def test_sigchld_ignored(tmp_path):
    """A launcher whose SIGCHLD is ignored (as a parent may leave it)
    still sees how each rank ended, and leaves SIGCHLD as it found it."""
    prog = _script(tmp_path, """
import os, sys
sys.exit(3 if os.environ["FABEP_RANK"] == "1" else 0)
""")
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        assert frun.launch(2, [prog], quiet=True) == 3
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGCHLD, old)
    # and from the command line, under a parent that ignores it
    if shutil.which("perl") is None:
        pytest.skip("no perl to start the launcher with SIGCHLD ignored")
    ok = tmp_path / "ok.py"
    ok.write_text("print('ok')\n")
    for prog, want in ((prog, 3), (str(ok), 0)):
        rc = subprocess.run(
            ["perl", "-e", '$SIG{CHLD} = "IGNORE"; exec @ARGV or die',
             sys.executable, "-m", "fabep.run", "-n", "2", prog],
            env=_env(), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, timeout=60).returncode
        assert rc == want


def test_signal_and_timeout(tmp_path):
    prog = _script(tmp_path, """
import os, signal, time
if os.environ["FABEP_RANK"] == "0":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
""")
    assert frun.launch(2, [prog], quiet=True) == 128 + 9
    prog = _script(tmp_path, "import time\ntime.sleep(60)\n")
    t0 = time.monotonic()
    assert frun.launch(2, [prog], timeout=1, quiet=True) == 124
    assert time.monotonic() - t0 < 15


def _pids(tmp_path, n, limit=30.0):
    """The ranks' pids, as their scripts wrote them."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            return [int((tmp_path / ("pid%d" % r)).read_text())
                    for r in range(n)]
        except (OSError, ValueError):
            time.sleep(0.1)
    raise AssertionError("the ranks did not start")


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie is gone too (its parent, the launcher, has ended)
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_launcher_signal_stops_the_ranks(tmp_path, sig, sigint_default):
    """A signal sent to the launcher alone: the ranks are stopped and
    their shm regions removed, and the launcher ends by that signal."""
    prog = _script(tmp_path, """
import os, sys, time
import fabep
c = fabep.Comm.from_env(provider="shm")
c.barrier()
open(sys.argv[1] + os.environ["FABEP_RANK"] + ".tmp", "w").write(
    str(os.getpid()))
os.rename(sys.argv[1] + os.environ["FABEP_RANK"] + ".tmp",
          sys.argv[1] + os.environ["FABEP_RANK"])
time.sleep(60)
""")
    p = subprocess.Popen([sys.executable, "-m", "fabep.run", "-n", "2", prog,
                          str(tmp_path / "pid")], env=_env(),
                         stderr=subprocess.DEVNULL)
    pids = _pids(tmp_path, 2)
    p.send_signal(sig)
    assert p.wait(20) == -sig
    end = time.monotonic() + 5
    while not all(_gone(q) for q in pids) and time.monotonic() < end:
        time.sleep(0.1)
    for q in pids:
        assert _gone(q), "rank %d still runs" % q
        assert _regions(q) == [], "rank %d's regions are left" % q


def test_raising_rank_does_not_hold_the_others(tmp_path):
    """A rank whose program raises, the others in a barrier: it does not
    wait in a collective goodbye at exit (its communicator is aborted),
    so the launcher names it and stops the others well before the
    communicator's timeout of 30 s."""
    prog = _script(tmp_path, """
import os
import fabep
c = fabep.Comm.from_env(provider="shm", timeout_ms=30000)
c.barrier()
if os.environ["FABEP_RANK"] == "1":
    raise RuntimeError("rank 1 gives up")
c.barrier()
""")
    t0 = time.monotonic()
    assert frun.launch(3, [prog], env=_env(), quiet=True) == 1
    assert time.monotonic() - t0 < 15


def _with_body(me, n):
    """Leaving a with block by an exception aborts: the ranks that stay
    see this one lost at once."""
    import time
    import fabep
    try:
        with fabep.Comm.from_env(timeout_ms=30000) as comm:
            comm.barrier()
            if me == 1:
                raise KeyError("out")
            t0 = time.monotonic()
            try:
                comm.barrier()
            except fabep.PeerLostError:
                return time.monotonic() - t0 < 10
            return False
    except KeyError:
        time.sleep(3)  # alive: the others learn it from the bootstrap
        return True


def test_with_block_aborts():
    import ranks
    assert ranks.run(3, _with_body) == [True, True, True]


def test_command_line(tmp_path):
    prog = _script(tmp_path, "import sys\nsys.exit(0)\n")
    env = _env()
    r = subprocess.run([sys.executable, "-m", "fabep.run", "-n", "2", prog],
                       env=env)
    assert r.returncode == 0
    r = subprocess.run([sys.executable, "-m", "fabep.run", "-n", "0", prog],
                       env=env, stderr=subprocess.DEVNULL)
    assert r.returncode == 2
    r = subprocess.run([sys.executable, "-m", "fabep.run", "-n", "2", prog],
                       env=dict(env, FABEP_BIND="off"), stderr=subprocess.PIPE)
    assert r.returncode == 2 and b"FABEP_BIND=off" in r.stderr
    for t in ("-1", "nan"):
        r = subprocess.run([sys.executable, "-m", "fabep.run", "-t", t, "-n",
                            "2", prog], env=env, stderr=subprocess.PIPE)
        assert r.returncode == 2 and b"-t must be" in r.stderr


_EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "examples", "moe_layer.py")
# the example's layer, small
_SMALL = ["--hidden", "256", "--experts", "16", "--top-k", "4", "--tokens",
          "8", "--ffn", "8", "--iters", "2", "--warmup", "1"]


def _port_pair():
    """A socket listening on port P + 1, and P, free a moment ago: the
    kernel chose P + 1 alone, and P may be held (an outgoing connection's
    port), so P is tried too."""
    for _ in range(100):
        busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1] - 1
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            busy.close()
            continue
        finally:
            probe.close()
        busy.listen(1)
        return busy, port
    raise AssertionError("no free port next to a free one on 127.0.0.1")


@pytest.mark.parametrize("mode", [[], ["--zero-copy"]])
def test_example_layer(mode):
    """examples/moe_layer.py on 2 ranks, small, its output checked against
    one process (zero-copy: each expert gathers its rows by row_index);
    gloo's store must find its own port even where the one after
    FABEP_ROOT's is taken."""
    pytest.importorskip("torch.distributed")
    example = _EXAMPLE
    busy, port = _port_pair()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "fabep.run", "-n", "2", "--root",
             "127.0.0.1:%d" % port, example] + _SMALL + mode, env=_env(),
            capture_output=True, text=True, timeout=300)
    finally:
        busy.close()
    assert p.returncode == 0, p.stdout + p.stderr
    assert "result: correct" in p.stdout, p.stdout


def test_example_under_torchrun():
    """The README's torchrun command (torch.distributed.run is torchrun),
    with the per-rank output options Debian's torch 1.13 needs: the ranks
    take torchrun's variables and one rendezvous serves gloo and fabep."""
    pytest.importorskip("torch.distributed.run")
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
         "2", "-r", "0:1,1:1", "-t", "0:1,1:1", "--master_addr", "127.0.0.1",
         "--master_port", str(frun._free_port()), _EXAMPLE] + _SMALL,
        env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "result: correct" in p.stdout, p.stdout + p.stderr


def test_example_under_mpirun():
    """The README's mpirun command: the ranks take Open MPI's variables."""
    pytest.importorskip("torch.distributed")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("no mpirun")
    env = _env()
    cmd = [mpirun, "-n", "2", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for v in ("PYTHONPATH", "FABEP_LIBRARY"):
        if v in env:
            cmd += ["-x", v]
    cmd += ["-x", "FABEP_ROOT=127.0.0.1:%d" % frun._free_port(),
            sys.executable, _EXAMPLE] + _SMALL
    p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "result: correct" in p.stdout, p.stdout + p.stderr
