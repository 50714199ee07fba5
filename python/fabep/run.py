# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""Start N local ranks of a Python program, as the C tools' -n does.

    python3 -m fabep.run -n 4 script.py [args...]
    python3 -m fabep.run -n 4 -m package.module [args...]

Each rank is a new interpreter (sys.executable) with FABEP_RANK,
FABEP_WORLD_SIZE, FABEP_LOCAL_RANK, FABEP_LOCAL_SIZE and FABEP_ROOT
(127.0.0.1 and a free port, or --root) set, so fabep.Comm.from_env()
needs nothing else.  Ranks are bound as the C tools bind theirs and as
mpirun --bind-to core does: the cores this process may use, whole
physical cores, are shared out in contiguous blocks, rank r taking the
r-th block, and its fabep worker threads default to the block's cores
(FABEP_THREADS, unless set).  With more ranks than cores, or with
FABEP_BIND=none, they stay unbound.  OMP_NUM_THREADS, unless set, is
each rank's share of the CPUs (its block's CPUs, or unbound the CPUs of
this process divided by the ranks, at least 1), as torchrun sets it: so
torch's, OpenMP's and OpenBLAS's threads of N ranks do not each take
every CPU.

When a rank fails (nonzero exit or a signal) or --timeout passes, the
others are stopped (SIGTERM, then SIGKILL), and the launcher exits
nonzero: with the failing rank's status (128 + the signal for a
signal), 124 on a timeout; 0 when every rank succeeded.  A SIGTERM,
SIGHUP or SIGINT sent to the launcher is passed on to the ranks (SIGKILL
after 2 s), which are reaped and their shm regions removed, and then
ends the launcher; a launcher killed outright takes its ranks along
(each gets SIGTERM).  Everything after the script, or after -m MODULE,
is the program's.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time


def _free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _core_key(cpu):
    """(package, core) of a CPU from sysfs; the CPU itself if unknown."""
    key = []
    for f, default in (("physical_package_id", 0), ("core_id", cpu)):
        try:
            with open("/sys/devices/system/cpu/cpu%d/topology/%s" %
                      (cpu, f)) as fh:
                key.append(int(fh.read()))
        except (OSError, ValueError):
            key.append(default)
    return tuple(key)


def _cpus():
    """The CPUs this process may run on, sorted; None where the affinity
    cannot be read."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def bind_sets(nranks, env=None, cpus=None):
    """The CPU set of each rank (None: unbound), as the C tools' -n and
    mpirun --bind-to core: the CPUs (this process's by default) grouped
    by physical core, contiguous blocks of cores // nranks cores.  None
    for every rank with more ranks than cores, with FABEP_BIND=none, or
    where the affinity cannot be read."""
    env = os.environ if env is None else env
    cpus = _cpus() if cpus is None else cpus
    if env.get("FABEP_BIND") == "none" or not cpus:
        return [None] * nranks
    groups = {}
    for c in cpus:  # numbered in the order of their first CPU
        groups.setdefault(_core_key(c), []).append(c)
    groups = list(groups.values())
    if nranks > len(groups):
        return [None] * nranks
    per = len(groups) // nranks
    return [sorted(c for g in groups[r * per:(r + 1) * per] for c in g)
            for r in range(nranks)]


def _shm_cleanup(proc):
    """A rank that died, or exited without closing its communicators,
    leaves its shm regions in /dev/shm: remove them (fabep_shm_cleanup),
    where the library loads.  Once per rank, right after it is reaped: a
    later call could meet another process that took its pid."""
    if proc.returncode is None or getattr(proc, "_fabep_cleaned", False):
        return
    proc._fabep_cleaned = True
    try:
        from fabep._lib import lib
    except (ImportError, OSError):
        return
    lib.fabep_shm_cleanup(proc.pid)  # 0 or more removed: nothing to raise


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _prctl():
    """libc's prctl, looked up in the launcher (not between fork and
    exec, where loading anything may deadlock); None where missing."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _rank_setup(parent, cpus, prctl):
    """In a rank before it runs the program: SIGTERM when the launcher
    dies (PR_SET_PDEATHSIG), so that no rank outlives a launcher killed
    outright, and its CPUs."""
    if prctl is not None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:  # the launcher died before the prctl
        os._exit(1)
    if cpus:
        os.sched_setaffinity(0, cpus)


def _stop(procs, grace=2.0, sig=signal.SIGTERM):
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        _shm_cleanup(p)


def _status(rc):
    return 128 - rc if rc < 0 else rc


def launch(nranks, argv, timeout=0, root=None, env=None, quiet=False):
    """Run argv (a list, after the interpreter) on nranks local ranks.
    Returns the launcher's exit status (see the module's text)."""
    base = dict(os.environ if env is None else env)
    root = root or "127.0.0.1:%d" % _free_port()
    procs = []
    # the library first (it may be loaded by _shm_cleanup later): loading
    # libfabric installs its providers' signal handlers, which must not
    # replace the launcher's below
    try:
        from fabep import _lib  # noqa: F401
    except (ImportError, OSError):
        pass
    stop = []
    old = {}
    # SIGCHLD ignored (inherited from a parent that set it) makes the
    # kernel reap the ranks at once, and Popen then reads every rank's
    # status as 0, a failed one too: the default while the ranks run
    try:
        old[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except ValueError:  # not the main thread: signals stay as they are
        pass
    for sig in _STOP_SIGNALS:
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                continue  # nohup, a background job's SIGINT: stays so
            old[sig] = signal.signal(sig, lambda num, frame: stop.append(num))
        except ValueError:  # not the main thread: signals stay as they are
            break
    try:
        return _run(nranks, argv, timeout, root, base, quiet, procs, stop)
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        launch.stopped_by = stop[0] if stop else None


launch.stopped_by = None  # the signal that stopped the last launch()


def _run(nranks, argv, timeout, root, base, quiet, procs, stop):
    parent = os.getpid()
    prctl = _prctl()
    cpus = _cpus()
    sets = bind_sets(nranks, base, cpus)
    share = max(1, (len(cpus) if cpus else os.cpu_count() or 1) // nranks)
    for r in range(nranks):
        e = dict(base, FABEP_RANK=str(r), FABEP_WORLD_SIZE=str(nranks),
                 FABEP_LOCAL_RANK=str(r), FABEP_LOCAL_SIZE=str(nranks),
                 FABEP_ROOT=root)
        if not e.get("OMP_NUM_THREADS"):
            e["OMP_NUM_THREADS"] = str(len(sets[r]) if sets[r] else share)
        if sets[r]:
            # the block's cores, not cores / local ranks of the block
            if not e.get("FABEP_THREADS"):
                e["FABEP_THREADS"] = str(len({_core_key(c)
                                               for c in sets[r]}))
        pre = (lambda cpus: lambda: _rank_setup(parent, cpus, prctl))(
            sets[r])
        procs.append(subprocess.Popen([sys.executable] + list(argv), env=e,
                                      preexec_fn=pre))
    deadline = time.monotonic() + timeout if timeout else None
    status = 0
    try:
        while True:
            running = 0
            for r, p in enumerate(procs):
                rc = p.poll()
                if rc is None:
                    running += 1
                    continue
                _shm_cleanup(p)
                if rc != 0:
                    if not quiet:
                        print("fabep.run: rank %d %s; stopping the others" % (
                            r, "exited with %d" % rc if rc > 0 else
                            "killed by signal %d" % -rc), file=sys.stderr)
                    _stop(procs)
                    return _status(rc)
            if stop:
                if not quiet:
                    print("fabep.run: signal %d; stopping every rank" %
                          stop[0], file=sys.stderr)
                _stop(procs, sig=stop[0])
                return 128 + stop[0]
            if not running:
                return status
            if deadline and time.monotonic() > deadline:
                if not quiet:
                    print("fabep.run: timeout after %g s; stopping every "
                          "rank" % timeout, file=sys.stderr)
                _stop(procs)
                return 124
            time.sleep(0.02)
    except KeyboardInterrupt:
        _stop(procs)
        return 130


def _split(args):
    """The launcher's arguments and the program's: the program starts at
    its script (the first word that is not an option or an option's
    value) or after -m MODULE, so that its own options stay its own."""
    longs = ("--ranks", "--timeout", "--root")  # abbreviations too
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-m":
            return args[:i + 2], args[i + 2:]
        if a.startswith("-m"):  # -mMODULE
            return args[:i + 1], args[i + 1:]
        if a == "--":
            return args[:i], args[i + 1:]
        if a in ("-n", "-t") or (a.startswith("--") and "=" not in a and
                                 len(a) > 2 and
                                 any(o.startswith(a) for o in longs)):
            i += 2
        elif a.startswith("-") and a != "-":
            i += 1
        else:
            return args[:i], args[i:]
    return args, []


def main(args=None):
    ap = argparse.ArgumentParser(
        prog="python3 -m fabep.run",
        description="Run a Python program on N local fabep ranks.")
    ap.add_argument("-n", "--ranks", type=int, required=True,
                    help="number of ranks (processes) to start")
    ap.add_argument("-t", "--timeout", type=float, default=0,
                    help="stop every rank after this many seconds (0: never)")
    ap.add_argument("--root", help="FABEP_ROOT host:port (default: "
                    "127.0.0.1 and a free port)")
    ap.add_argument("-m", dest="module", help="run a module, as python3 -m")
    ap.add_argument("program", nargs="*",
                    help="script.py and its arguments (or, after -m "
                    "MODULE, the module's)")
    mine, prog = _split(sys.argv[1:] if args is None else list(args))
    a = ap.parse_args(mine)
    bind = os.environ.get("FABEP_BIND")
    if bind and bind != "none":  # as the C tools: not taken for "bind"
        ap.error("FABEP_BIND=%s: the one value taken is none (ranks left "
                 "unbound)" % bind)
    if a.ranks < 1:
        ap.error("-n must be at least 1")
    if not a.timeout >= 0 or a.timeout == float("inf"):  # NaN too
        ap.error("-t must be a number of seconds, 0 or more")
    argv = list(a.program) + prog
    if a.module:
        argv = ["-m", a.module] + argv
    if not argv:
        ap.error("no program given")
    rc = launch(a.ranks, argv, a.timeout, a.root)
    if launch.stopped_by is not None:
        # end by the signal, with its default action
        signal.signal(launch.stopped_by, signal.SIG_DFL)
        os.kill(os.getpid(), launch.stopped_by)
    return rc


if __name__ == "__main__":
    sys.exit(main())
