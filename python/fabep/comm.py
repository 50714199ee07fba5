# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""The communicator: bootstrap, the symmetric heap, one-sided puts."""
import ctypes
import operator
import os
import sys
import weakref

from . import _lib
from . import _tensor
from .errors import FabepError, Guard, Handle, InvalidArgumentError, \
    invalid, logged, raise_for, refuse, serial

lib = _lib.lib


def _call(ret, what):
    if ret < 0:
        raise_for(ret, what)
    return ret


INT_MAX = 2**31 - 1


_U64 = 2**64 - 1


def _uint(v, name, top=_U64):
    """v as a whole number from 0 to `top` for a C integer argument
    (uint64_t or size_t by default, INT_MAX for an int): a float, a
    negative value or one above top (which ctypes would wrap around
    without a word) or anything else is refused before the call."""
    if type(v) is int and 0 <= v <= top:  # most calls: one test
        return v
    try:
        v = operator.index(v)
    except TypeError:
        raise invalid("%s: expected a whole number, got %r" % (name, v)) \
            from None
    if v < 0:
        raise invalid("%s: %d is negative" % (name, v))
    if v > top:
        raise invalid("%s: %d is above %d" % (name, v, top))
    return v


def _cint(v, name):
    """v as a C int (negative allowed): refused when it does not fit."""
    try:
        v = operator.index(v)
    except TypeError:
        raise invalid("%s: expected a whole number, got %r" % (name, v)) \
            from None
    if not -INT_MAX - 1 <= v <= INT_MAX:
        raise invalid("%s: %d does not fit a C int" % (name, v))
    return v


def _signal_code(signal):
    if signal is None:
        return 0
    if isinstance(signal, int) and not isinstance(signal, bool):
        return _cint(signal, "signal")
    try:
        return _lib.SIGNALS.index(signal)
    except ValueError:
        raise invalid("signal=%r: expected one of %s" % (
            signal, ", ".join(_lib.SIGNALS))) from None


def _torchrun_env():
    """(rank, size, host, port) from torchrun's variables, or None."""
    e = os.environ
    if not all(k in e for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                "MASTER_PORT")):
        return None
    return int(e["RANK"]), int(e["WORLD_SIZE"]), e["MASTER_ADDR"], \
        int(e["MASTER_PORT"])


_store_seq = 0


def _store_prefix(agent):
    """The key prefix of a communicator's allgather on a torch store:
    fabep/<n>, n counting this process's communicators made on stores
    (every rank makes them in the same order, as any collective), so two
    never read each other's keys.  Under torchrun's agent store, which
    outlives a restart of the workers, it starts with the attempt
    (TORCHELASTIC_RESTART_COUNT), as torch's env:// rendezvous does: a new
    attempt's ranks would otherwise read the blocks an earlier attempt
    left there."""
    global _store_seq
    _store_seq += 1
    if agent:
        return "fabep/attempt_%s/%d" % (
            os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), _store_seq)
    return "fabep/%d" % _store_seq


class _StoreAllgather:
    """The C allgather over a torch.distributed Store (set/get by key)."""

    def __init__(self, store, rank, size, prefix):
        self.store, self.rank, self.size = store, rank, size
        self.prefix, self.calls = prefix, 0

    def __call__(self, data):
        key = "%s/%d/" % (self.prefix, self.calls)
        self.calls += 1
        self.store.set(key + str(self.rank), data)
        out = [self.store.get(key + str(r)) for r in range(self.size)]
        # every rank has read every block once it reaches this counter,
        # so the last one to arrive removes this call's keys
        if self.store.add(key + "done", 1) == self.size:
            for r in range(self.size):
                self.store.delete_key(key + str(r))
            self.store.delete_key(key + "done")
        return b"".join(out)


class _GroupAllgather:
    """The C allgather as an all_gather over a torch.distributed group."""

    def __init__(self, group):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.group = torch, dist, group
        self.device = "cpu"
        if dist.get_backend(group) == "nccl":
            self.device = "cuda:%d" % torch.cuda.current_device()

    def __call__(self, data):
        torch, dist = self.torch, self.dist
        n = dist.get_world_size(self.group)
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        t = t.to(self.device)
        outs = [torch.empty_like(t) for _ in range(n)]
        dist.all_gather(outs, t, group=self.group)
        return b"".join(bytes(o.cpu().numpy()) for o in outs)


class HeapBlock:
    """A block of the symmetric heap: the same offset on every rank.

    ``offset`` names it in put/put_signal/wait; ``numpy(dtype)`` and
    ``torch(dtype)`` view this rank's copy without copying.  The views
    are valid until the communicator is closed or aborted: close()
    unmaps the heap, and a view used after it reads unmapped memory (the
    view does not keep the heap mapped).
    """

    def __init__(self, comm, offset, nbytes):
        self.comm, self.offset, self.nbytes = comm, offset, nbytes

    def __int__(self):
        return self.offset

    __index__ = __int__

    def __repr__(self):
        return "HeapBlock(offset=%d, nbytes=%d)" % (self.offset, self.nbytes)

    def numpy(self, dtype="u8"):
        """This rank's bytes as a 1-D numpy array of dtype (a name of
        fabep._tensor: fp32, bf16, u8, i32)."""
        return self._view("numpy", dtype)

    def torch(self, dtype="u8"):
        """This rank's bytes as a 1-D torch tensor of dtype."""
        return self._view("torch", dtype)

    def _view(self, kind, dtype):
        if dtype not in _tensor.ITEMSIZE:
            raise invalid("dtype=%r: expected one of %s" % (
                dtype, ", ".join(_tensor.ITEMSIZE)))
        n = self.nbytes // _tensor.ITEMSIZE[dtype]
        addr = lib.fabep_heap_ptr(self.comm._handle(), self.offset)
        return _tensor.view(kind, addr, (n,), dtype, self.comm)


def _off(x, name="offset"):
    if type(x) is int and 0 <= x <= _U64:  # most calls: one test
        return x
    return x.offset if isinstance(x, HeapBlock) else _uint(x, name)


# Set once an exception reached sys.excepthook: the interpreter then ends,
# and the communicators it frees are aborted, not destroyed collectively
# (the peers may wait in a call this rank will never make).
_uncaught = []


def _watch_uncaught():
    """Chain a note of uncaught exceptions into sys.excepthook, once."""
    prev = sys.excepthook
    if getattr(prev, "_fabep", False):
        return

    def hook(tp, val, tb):
        _uncaught.append(tp)
        prev(tp, val, tb)

    hook._fabep = True
    sys.excepthook = hook


class Comm(Handle):
    """A fabep communicator (fabep_comm_create).  Collective.

    Without `allgather` the ranks meet through the environment: FABEP_RANK,
    FABEP_WORLD_SIZE and FABEP_ROOT (host:port of rank 0's rendezvous),
    else mpirun's OMPI_COMM_WORLD_*, PMI_* or Slurm's SLURM_* with
    FABEP_ROOT.  Comm.from_env adds torchrun's variables;
    Comm.from_process_group reuses a torch.distributed group.

    allgather(data: bytes) -> bytes, when given, must return every rank's
    `data` concatenated in rank order (it is called collectively, and
    from the thread that made the fabep call); rank and size then say
    where this process stands.

    Keyword arguments set fabep_comm_attr_t (None or 0 = environment or
    default): provider ("shm", "tcp", ...), domain, signal ("ordered",
    "fence", "delivery", "cqdata", "cma"), timeout_ms, heap_size (bytes; size it
    with MoE.heap_bytes and AllReduce.heap_bytes), threads, numa_node
    (None or -1 = environment or default; 0 is node 0),
    rendezvous_timeout_ms (how long the FABEP_ROOT rendezvous waits for
    every rank: FABEP_RENDEZVOUS_TIMEOUT_MS, else timeout_ms; -1 = no
    limit, for ranks that start minutes apart; later calls keep
    timeout_ms).  A value refused
    here is refused by the C call on every rank too, so no rank waits for
    this one: this rank raises the reason (InvalidArgumentError), the
    others PeerError ("a peer rank reported an error").  A rank or size
    that is not a C int is refused too, but a rank that does not know
    its place cannot answer the others' allgather: theirs fails on its
    own.

    close() (or leaving a ``with`` block) destroys it; it is collective
    as long as every rank is alive.  A communicator is used by one thread
    at a time: a call on it, or on a handle made on it, while another
    thread is inside one raises InUseError (queries such as rank, size
    and counter() excepted).
    """

    _what = "communicator"

    def __init__(self, *, allgather=None, rank=None, size=None, provider=None,
                 domain=None, signal=None, timeout_ms=0, heap_size=0,
                 threads=0, numa_node=-1, rendezvous_timeout_ms=0):
        self._h = None
        self._pid = os.getpid()  # a child of fork() leaves it to this one
        self._guard = Guard()
        self._handles = weakref.WeakSet()
        self._live = {}   # key: (destroy function's name, C handle)
        a = _lib.CommAttr()
        lib.fabep_comm_attr_init(ctypes.byref(a))
        self._cb = None
        if allgather is not None:
            if rank is None or size is None:
                raise invalid("Comm: allgather needs rank and "
                              "size")
            self._allgather_fn = allgather
            self._size_arg = size
            self._cb_error = None
            self._cb = _lib.ALLGATHER_FN(self._allgather_cb)
            a.allgather = self._cb
        bad = None
        try:
            if allgather is not None:
                # inside the try: a refused rank or size still reaches
                # the C call, which then fails on every rank
                a.rank = _cint(rank, "rank")
                a.nranks = _cint(size, "size")
            if allgather is None and (rank is not None or size is not None):
                raise invalid("Comm: rank and size go with allgather; "
                              "without it the environment names the ranks")
            for k, v in (("provider", provider), ("domain", domain)):
                if v is not None and not isinstance(v, str):
                    raise invalid("%s=%r: expected a name" % (k, v))
            self._provider = provider.encode() if provider else None
            self._domain = domain.encode() if domain else None
            a.provider = self._provider
            a.domain = self._domain
            a.signal = _signal_code(signal)
            if timeout_ms:
                a.timeout_ms = _uint(timeout_ms, "timeout_ms", INT_MAX)
            if heap_size:
                a.heap_size = _uint(heap_size, "heap_size")
            if threads:
                a.threads = _uint(threads, "threads", INT_MAX)
            if numa_node is not None and numa_node != -1:
                a.numa_node = _uint(numa_node, "numa_node", INT_MAX)
            if rendezvous_timeout_ms == -1:
                a.rendezvous_timeout_ms = -1
            elif rendezvous_timeout_ms:
                a.rendezvous_timeout_ms = _uint(rendezvous_timeout_ms,
                                                "rendezvous_timeout_ms", INT_MAX)
        except (InvalidArgumentError, OverflowError) as e:
            # a strategy the C call refuses: it fails on every rank
            bad, a.signal = e, -1
        h = ctypes.c_void_p()

        def create():
            # a provider loaded by the fabric's opening may bring
            # libinfinipath's handlers (_lib.keep_signals)
            return _lib.keep_signals(lib.fabep_comm_create, ctypes.byref(a),
                                     ctypes.byref(h))
        if bad is not None:  # C refuses signal -1 on every rank
            refuse("Comm", bad, create,
                   lambda ret: ret == 0 and lib.fabep_comm_abort(h))
        ret = create()
        if ret < 0:
            err = self._cb_error if self._cb is not None else None
            try:
                raise_for(ret, "fabep_comm_create")
            except FabepError as e:
                if err is not None:
                    raise e from err
                raise
        self._h = h.value
        _watch_uncaught()

    def _allgather_cb(self, sendbuf, recvbuf, length, ctx):
        # Runs with the GIL (ctypes takes it back for the callback) while
        # the C call that called it has released it: no lock is held.
        try:
            data = ctypes.string_at(sendbuf, length) if length else b""
            out = self._allgather_fn(data)
            if not isinstance(out, (bytes, bytearray)):
                raise TypeError("allgather returned %s, expected bytes"
                                % type(out).__name__)
            if len(out) != length * self._size_arg:
                raise ValueError("allgather returned %d bytes, expected %d"
                                 % (len(out), length * self._size_arg))
            ctypes.memmove(recvbuf, out, len(out))
            return 0
        except BaseException as e:  # noqa: B902 - reported to C as a code
            self._cb_error = e
            # -FABEP_ERR_PEER: the caller's control plane failed
            return -(_lib.ERR_BASE + 2)

    @classmethod
    def from_env(cls, **kw):
        """A communicator from the environment: FABEP_*, mpirun, PMI and
        Slurm (as fabep_comm_create reads them), or torchrun's RANK,
        WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which take precedence over
        mpirun's, PMI's and Slurm's under torchrun's agent
        (TORCHELASTIC_RUN_ID: torchrun inside srun).  Under torchrun the ranks
        meet through a torch TCPStore at MASTER_ADDR:MASTER_PORT (the
        agent's store when torchrun runs one), or through the default
        process group's store when torch.distributed is initialized."""
        e = os.environ
        explicit = any(e.get(v) for v in ("FABEP_RANK", "FABEP_WORLD_SIZE"))
        launcher = any(e.get(v) for v in (
            "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"))
        tr = _torchrun_env()
        # torchrun's agent describes its worker; the job step's variables
        # it inherits (torchrun under srun or sbatch) describe the agent
        if explicit or tr is None or (launcher and
                                      not e.get("TORCHELASTIC_RUN_ID")):
            return cls(**kw)
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return cls.from_process_group(None, **kw)
        rank, size, host, port = tr
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        from datetime import timedelta
        # multi_tenant, as torch's own env:// rendezvous: rank 0's server
        # on MASTER_PORT is shared with a later init_process_group in
        # this process instead of holding the port against it
        store = dist.TCPStore(host, port, size, rank == 0 and not agent,
                              timeout=timedelta(seconds=300),
                              multi_tenant=True)
        return cls._from_store(store, rank, size, _store_prefix(agent), kw)

    @classmethod
    def from_process_group(cls, group=None, use_store=None, **kw):
        """A communicator over the ranks of a torch.distributed process
        group (None: the default group), with no second rendezvous.

        The bootstrap's allgather runs as torch.distributed.all_gather on
        the group, or, for the default group with use_store=True, as
        set/get on its store (the key prefix fabep/<n>)."""
        import torch.distributed as dist
        rank = dist.get_rank(group)
        size = dist.get_world_size(group)
        if use_store:
            from torch.distributed import distributed_c10d as c10d
            store = c10d._get_default_store()
            return cls._from_store(store, rank, size, _store_prefix(False),
                                   kw)
        return cls(allgather=_GroupAllgather(group), rank=rank, size=size,
                   **kw)

    @classmethod
    def _from_store(cls, store, rank, size, prefix, kw):
        return cls(allgather=_StoreAllgather(store, rank, size, prefix),
                   rank=rank, size=size, **kw)

    # -- lifetime -------------------------------------------------------------
    @serial
    def close(self):
        """Destroy the handles made on it, then the communicator
        (collective while every rank is alive).  Safe to call twice."""
        h = self._free_handles()
        if h is not None:
            _call(lib.fabep_comm_destroy(h), "fabep_comm_destroy")

    @serial
    def abort(self):
        """Free it as a rank that gives up does (fabep_comm_abort): not
        collective, without waiting for the peers, which see this rank
        lost at once instead of at their timeout.  Leaving a ``with``
        block by an exception aborts, and so does the garbage collector
        after an exception nothing caught, since the peers may wait in a
        call this rank will never make.  Safe to call twice."""
        h = self._free_handles()
        if h is not None:
            lib.fabep_comm_abort(h)

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self):
        if getattr(self, "_h", None) is None:
            return
        # in a child of fork(), the parent's: its close would only be
        # refused (ForkedError) and log that it was
        if getattr(self, "_pid", None) != os.getpid():
            return
        try:
            # the interpreter ends after an exception nothing caught
            if _uncaught:
                self.abort()
            else:
                self.close()
        except Exception:
            pass

    def _free_handles(self):
        """Destroy the handles made on it; the C communicator, now
        closed here, or None if it was."""
        if self._h is None:
            return None
        # a handle's error (in a child of fork(), ForkedError) is the
        # communicator's too: its own destroy below raises it
        for hnd in list(self._handles):
            try:
                hnd.close()
            except FabepError:
                pass
        # the C handles of objects the garbage collector takes with this
        # one (a reference cycle): their weak references are gone before
        # any finalizer runs, and theirs may run after this one
        for destroy, h in reversed(list(self._live.values())):
            getattr(lib, destroy)(h)
        self._live.clear()
        logged()  # the handles' messages: not the communicator's error's
        h, self._h = self._h, None
        return h

    def _adopt(self, hnd, destroy, h):
        """Register hnd, a handle made on this communicator whose C
        handle h the library's function named `destroy` frees.  Returns
        the key for _release."""
        key = object()
        self._handles.add(hnd)
        self._live[key] = (destroy, h)
        return key

    def _release(self, key):
        """Free the C handle registered under key, unless close() has
        (each is freed once, before the communicator).  Raises the C
        call's error (a child of fork() may not free the parent's)."""
        item = self._live.pop(key, None)
        if item is not None:
            _call(getattr(lib, item[0])(item[1]), item[0])

    # -- queries --------------------------------------------------------------
    @property
    def rank(self):
        """This process's rank."""
        return lib.fabep_comm_rank(self._handle())

    @property
    def size(self):
        """The number of ranks."""
        return lib.fabep_comm_size(self._handle())

    @property
    def provider(self):
        """The libfabric provider in use, e.g. "shm"."""
        return lib.fabep_comm_provider(self._handle()).decode()

    @property
    def domain(self):
        """The libfabric domain in use."""
        return lib.fabep_comm_domain(self._handle()).decode()

    @property
    def signal(self):
        """The put + signal strategy in use ("ordered", "fence", ...)."""
        return lib.fabep_signal_name(
            lib.fabep_comm_signal(self._handle())).decode()

    @property
    def threads(self):
        """Worker threads of the communicator's pool."""
        return lib.fabep_comm_threads(self._handle())

    @property
    def numa_node(self):
        """NUMA node of the pool and the heap."""
        return lib.fabep_comm_numa_node(self._handle())

    @property
    def channels(self):
        """Endpoints per rank that large puts are split over."""
        return lib.fabep_comm_channels(self._handle())

    @property
    def heap_size(self):
        """Bytes of the symmetric heap."""
        return lib.fabep_heap_size(self._handle())

    def __repr__(self):
        if self._h is None:
            return "<fabep.Comm closed>"
        return "<fabep.Comm rank %d of %d on %s>" % (self.rank, self.size,
                                                   self.provider)

    # -- collectives and one-sided operations ---------------------------------
    @serial
    def barrier(self):
        """Wait until every rank has reached the barrier.  Collective."""
        ret = lib.fabep_barrier(self._handle())
        if ret:
            raise_for(ret, "fabep_barrier")

    @serial
    def heap_alloc(self, nbytes, align=0):
        """Allocate `nbytes` (zeroed) from the symmetric heap; every rank
        makes the same allocations in the same order.  align: a power of
        two up to 4096 (0 = 64).  Returns a HeapBlock."""
        off = ctypes.c_uint64()
        h = self._handle()
        nbytes, align = _uint(nbytes, "nbytes"), _uint(align, "align")
        _call(lib.fabep_heap_alloc(h, nbytes, align, ctypes.byref(off)),
              "fabep_heap_alloc")
        return HeapBlock(self, off.value, nbytes)

    @serial
    def put(self, peer, dst, src, nbytes):
        """Write nbytes from this rank's heap offset `src` to offset `dst`
        on `peer` (offsets or HeapBlocks; each side's bytes within one
        block of heap_alloc, else fabep.RangeError).  Returns
        once posted; call flush() before reusing the source."""
        ret = lib.fabep_put(self._handle(), _uint(peer, "peer", INT_MAX),
                            _off(dst, "dst"), _off(src, "src"),
                            _uint(nbytes, "nbytes"))
        if ret:
            raise_for(ret, "fabep_put")

    @serial
    def put_signal(self, peer, dst, src, nbytes, sig, add=1):
        """put(), then add `add` to the uint64 counter at heap offset
        `sig` on `peer`: when the peer sees the counter move, the data is
        there.  nbytes may be 0 (signal only)."""
        ret = lib.fabep_put_signal(self._handle(), _uint(peer, "peer", INT_MAX),
                                   _off(dst, "dst"), _off(src, "src"),
                                   _uint(nbytes, "nbytes"), _off(sig, "sig"),
                                   _uint(add, "add"))
        if ret:
            raise_for(ret, "fabep_put_signal")

    @serial
    def get(self, peer, dst, src, nbytes):
        """Read nbytes at heap offset `src` of `peer` into this rank's
        offset `dst` (offsets or HeapBlocks; peer may be this rank).
        Returns once posted; the bytes are at dst after flush().  Order it
        after the peer's writes of those bytes (wait for a counter the
        peer signals); off shm the peer's progress serves it."""
        ret = lib.fabep_get(self._handle(), _uint(peer, "peer", INT_MAX),
                            _off(dst, "dst"), _off(src, "src"),
                            _uint(nbytes, "nbytes"))
        if ret:
            raise_for(ret, "fabep_get")

    @serial
    def flush(self):
        """Wait until this rank's puts and gets have completed locally
        (sources reusable, gets' bytes in place)."""
        ret = lib.fabep_flush(self._handle())
        if ret:
            raise_for(ret, "fabep_flush")

    @serial
    def wait(self, sig, target):
        """Wait until the local counter at heap offset `sig` reaches
        `target` (counters only grow).  The GIL is released meanwhile.
        Raises fabep.TimeoutError after the communicator's timeout; the
        communicator stays usable (wait again, or go on)."""
        ret = lib.fabep_wait(self._handle(), _off(sig, "sig"),
                             _uint(target, "target"))
        if ret:
            raise_for(ret, "fabep_wait")

    def counter(self, sig):
        """The local counter at heap offset `sig` now (0 for an offset
        that is not 8-byte aligned or not within a block of heap_alloc, as
        fabep_counter_read(3))."""
        return lib.fabep_counter_read(self._handle(), _off(sig, "sig"))

    @serial
    def progress(self):
        """Drive the fabric's progress once."""
        ret = lib.fabep_progress(self._handle())
        if ret < 0:
            raise_for(ret, "fabep_progress")
