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
signal), 124 on a timeout; 0 when every rank succeeded.
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


def _stop(procs, grace=2.0):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
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
    cpus = _cpus()
    sets = bind_sets(nranks, base, cpus)
    share = max(1, (len(cpus) if cpus else os.cpu_count() or 1) // nranks)
    for r in range(nranks):
        e = dict(base, FABEP_RANK=str(r), FABEP_WORLD_SIZE=str(nranks),
                 FABEP_LOCAL_RANK=str(r), FABEP_LOCAL_SIZE=str(nranks),
                 FABEP_ROOT=root)
        if not e.get("OMP_NUM_THREADS"):
            e["OMP_NUM_THREADS"] = str(len(sets[r]) if sets[r] else share)
        pre = None
        if sets[r]:
            # the block's cores, not cores / local ranks of the block
            if not e.get("FABEP_THREADS"):
                e["FABEP_THREADS"] = str(len({_core_key(c)
                                               for c in sets[r]}))
            pre = (lambda cpus: lambda: os.sched_setaffinity(0, cpus))(
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
    ap.add_argument("program", nargs=argparse.REMAINDER,
                    help="script.py and its arguments")
    a = ap.parse_args(args)
    if a.ranks < 1:
        ap.error("-n must be at least 1")
    argv = list(a.program)
    if a.module:
        argv = ["-m", a.module] + argv
    if not argv:
        ap.error("no program given")
    return launch(a.ranks, argv, a.timeout, a.root)


if __name__ == "__main__":
    sys.exit(main())
