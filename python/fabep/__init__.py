# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""fabep: Mixture-of-Experts communication over libfabric RMA, from Python.

A pure-Python binding (ctypes) of libfabep's public C API:

    Comm        a communicator (from the environment, torchrun, or a
                torch.distributed process group), its symmetric heap,
                put / put_signal / get / wait, barrier
    MoE         dispatch / combine and their send / recv halves, the
                receive view (RecvView), the send buffer, the backward
                passes, timing
    AllReduce   allreduce, allreduce_rmsnorm, allreduce_rmsnorm_fp8
    FabepError  and one subclass per error code (fabep.errors)

Tensors go in and out without copies: torch CPU tensors (bfloat16,
float32, uint8 FP8 codes with fp32 scales) and numpy arrays (float32,
uint16 holding bf16 bits, uint8).  Library-owned outputs (the receive
view's arrays, the send buffer, heap blocks) view the library's memory
and are valid until the next call on the handle that made them (heap
blocks: until the communicator is closed); close() and abort() unmap
that memory, and an array used after them reads unmapped memory.

Every foreign call releases the GIL (ctypes.CDLL), so waits on the
fabric let other Python threads run.  A communicator and its handles are
used by one thread at a time: another thread's call meanwhile raises
InUseError.  They belong to the process that made them: in a child of
os.fork() after that, every call on them raises ForkedError.
``python3 -m fabep.run -n 4 script.py`` starts local ranks.
"""
from ._lib import VERSION as __version__  # noqa: F401
from ._lib import lib as _clib
from .errors import (FabepError, InvalidArgumentError,  # noqa: F401
                     RangeError,
                     MessageSizeError, NoMemoryError, NotSupportedError,
                     TimeoutError, MismatchError, PeerError, PeerLostError,
                     ProtocolError, NoProviderError, NoSignalError,
                     HeapFullError, BusyError, StaleViewError, InUseError,
                     ForkedError)
from .comm import Comm, HeapBlock  # noqa: F401
from .moe import MoE, RecvView, Timing  # noqa: F401
from .allreduce import AllReduce  # noqa: F401


def version():
    """The version of the C library loaded, "MAJOR.MINOR.PATCH"."""
    return __version__


def isa():
    """The instruction-set level of the local kernels ("scalar", "avx2",
    "avx512")."""
    return _clib.fabep_isa_name(_clib.fabep_isa()).decode()


def strerror(code):
    """The text of a fabep error code (a C int)."""
    from .comm import _cint
    return _clib.fabep_strerror(_cint(code, "code")).decode(errors="replace")


def shm_cleanup(pid):
    """Remove the shared-memory regions that process `pid` of this host
    left in /dev/shm when it died without closing its communicators
    (fabep_shm_cleanup): for launchers, after reaping a rank.  Returns
    how many it removed; raises InvalidArgumentError for a pid of 0 or
    less, and FabepError with code -EBUSY while a process with that pid
    is alive."""
    from .comm import _cint
    from .errors import invalid, raise_for
    if isinstance(pid, bool):
        raise invalid("pid: expected a whole number, got %r" % (pid,))
    ret = _clib.fabep_shm_cleanup(_cint(pid, "pid"))
    if ret < 0:
        raise_for(ret, "fabep_shm_cleanup")
    return ret


def providers(name=None, max_count=32):
    """The libfabric providers fabep can use (fabep_provider_list), as
    dicts of what each grants."""
    import ctypes
    from . import _lib
    from .errors import invalid, raise_for
    if not isinstance(max_count, int) or max_count < 1:
        raise invalid("max_count=%r: expected a whole number, at least 1"
                      % (max_count,))
    if name is not None and not isinstance(name, str):
        raise invalid("name=%r: expected a provider's name or None"
                      % (name,))
    descs = (_lib.ProviderDesc * max_count)()
    descs[0].size = ctypes.sizeof(_lib.ProviderDesc)  # the stride
    count = ctypes.c_int()
    ret = _clib.fabep_provider_list(name.encode() if name else None, descs,
                                    max_count, ctypes.byref(count))
    if ret:
        raise_for(ret, "fabep_provider_list")
    out = []
    for d in descs[:count.value]:
        r = {}
        for f, _t in d._fields_:
            if f == "size":
                continue
            v = getattr(d, f)
            r[f] = v.decode(errors="replace") if isinstance(v, bytes) else v
        r["signal"] = (_lib.SIGNALS[d.signal]
                       if 0 <= d.signal < len(_lib.SIGNALS) else d.signal)
        out.append(r)
    return out


# fabep.TimeoutError stays out of `import *`: there it would hide the
# built-in TimeoutError (its base class) from `except TimeoutError`.
__all__ = ["Comm", "HeapBlock", "MoE", "RecvView", "Timing", "AllReduce",
           "FabepError", "InvalidArgumentError", "RangeError",
           "MessageSizeError", "NoMemoryError", "NotSupportedError",
           "MismatchError", "PeerError", "PeerLostError",
           "ProtocolError", "NoProviderError", "NoSignalError",
           "HeapFullError", "BusyError", "StaleViewError", "InUseError",
           "ForkedError", "version", "isa",
           "strerror", "providers", "shm_cleanup"]
