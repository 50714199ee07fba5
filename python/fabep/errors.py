# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""fabep's errors as Python exceptions.

Every failing C call becomes an instance of a FabepError subclass chosen
by its code: ``err.code`` is the negative C code, ``err.strerror`` the
text of fabep_strerror(), and ``str(err)`` that text followed by the
messages the library logged for this failure (for a timeout they name
the peers that never signalled).

The messages come from fabep_last_error(3): the library keeps the error
messages it logged on the calling thread, whatever FABEP_LOG says, and
the package reads them when a call fails (and drops them where it made
a C call fail on purpose), so an exception carries the messages of its
own failure.  Standard error is not touched: the library still prints
its log there as FABEP_LOG allows.

Handle is the base of the package's handle classes (Comm, MoE,
AllReduce): their context manager, their close by the garbage
collector, and the InvalidArgumentError of a call on a closed one.
"""
import builtins
import contextlib
import errno
import functools
import os
import threading

from . import _lib


class FabepError(Exception):
    """A fabep call failed.  ``code`` is the negative C error code."""

    def __init__(self, code, message=None):
        self.code = code
        self.strerror = _lib.lib.fabep_strerror(code).decode(errors="replace")
        self.message = message or self.strerror
        super().__init__(self.message)


class InvalidArgumentError(FabepError, ValueError):
    """-EINVAL: a bad argument (dtype, shape, NULL, configuration)."""


def invalid(message):
    """The InvalidArgumentError (-EINVAL) for an input refused here."""
    return InvalidArgumentError(-errno.EINVAL, message)


class RangeError(FabepError, ValueError):
    """-ERANGE or -EOVERFLOW: a value out of range (an expert id outside
    [-1, E), sizes whose product overflows)."""


class MessageSizeError(FabepError, ValueError):
    """-EMSGSIZE: more tokens or rows than the handle was made for."""


class NoMemoryError(FabepError, MemoryError):
    """-ENOMEM: host memory ran out."""


class NotSupportedError(FabepError):
    """-ENOTSUP / -ENOSYS: not offered by this configuration or provider."""


class TimeoutError(FabepError, builtins.TimeoutError):
    """-ETIMEDOUT: peers did not answer within the timeout; the message
    names them."""


class MismatchError(FabepError):
    """Configurations differ between ranks."""


class PeerError(FabepError):
    """A peer reported an error in a collective call."""


class PeerLostError(FabepError):
    """A peer died or closed its connection."""


class ProtocolError(FabepError):
    """A peer sent a malformed message or count."""


class NoProviderError(FabepError):
    """No libfabric provider fits the request."""


class NoSignalError(FabepError):
    """The requested signal strategy is not supported."""


class HeapFullError(FabepError, MemoryError):
    """The symmetric heap has no room left."""


class BusyError(FabepError):
    """All buffer sets hold dispatches not yet combined."""


class ForkedError(FabepError, RuntimeError):
    """-EPERM: a call in a child of fork() on a communicator made before
    the fork, or on a handle made on it (close included): they belong to
    the parent, whose endpoints and connections would carry the child's
    traffic.  A child makes a communicator of its own."""


class InUseError(FabepError, RuntimeError):
    """-EBUSY: a call on a communicator, or on a handle made on it, while
    another thread is inside one of theirs: a communicator and its
    handles are used by one thread at a time."""

    def __init__(self, message):
        super().__init__(-errno.EBUSY, message)


class StaleViewError(FabepError):
    """A receive view was read after a later call on its handle."""

    def __init__(self, message):
        super().__init__(-errno.ESTALE, message)


_BY_CODE = {
    errno.EINVAL: InvalidArgumentError,
    errno.ERANGE: RangeError,
    errno.EOVERFLOW: RangeError,
    errno.EMSGSIZE: MessageSizeError,
    errno.ENOMEM: NoMemoryError,
    errno.ENOTSUP: NotSupportedError,
    errno.ENOSYS: NotSupportedError,
    errno.ETIMEDOUT: TimeoutError,
    errno.EPERM: ForkedError,
}
for _i, _name in enumerate(_lib.ERR_NAMES):
    _BY_CODE[_lib.ERR_BASE + 1 + _i] = {
        "MISMATCH": MismatchError, "PEER": PeerError,
        "PEER_LOST": PeerLostError, "PROTOCOL": ProtocolError,
        "NO_PROVIDER": NoProviderError, "NO_SIGNAL": NoSignalError,
        "HEAP_FULL": HeapFullError, "BUSY": BusyError}[_name]


def error_class(code):
    """The FabepError subclass for a (negative) C code."""
    return _BY_CODE.get(-code, FabepError)


def logged():
    """The error messages the library logged on this thread since they
    were last read (fabep_last_error(3)), one per line; "" if none."""
    return _lib.lib.fabep_last_error().decode(errors="replace")


@contextlib.contextmanager
def quiet():
    """Mute the calling thread's library log lines (fabep_log_quiet(3))
    for the block; the messages are still kept for logged() and
    raise_for to read."""
    was = _lib.lib.fabep_log_quiet(1)
    try:
        yield
    finally:
        _lib.lib.fabep_log_quiet(was)


def refuse(what, err, call, settle=None, c_name=None):
    """Pass err, an input this package refused, to every rank, and raise.

    call() makes the C call that fails with -EINVAL on every rank for
    such an input (a NULL buffer, a type -1), so that none waits for
    this one.  It runs with this thread's log lines muted: its complaint
    is not the reason, which err names.  settle(ret), when given, does
    the handle's bookkeeping with the call's return value (0 cannot
    happen; settle frees what such a call would have made).

    Raised: err, ctypes' OverflowError becoming InvalidArgumentError;
    with c_name, the C error instead where the call failed with another
    code than err's (a peer lost meanwhile)."""
    with quiet():
        ret = call()
    if settle is not None:
        settle(ret)
    if c_name is not None and ret and ret != getattr(err, "code", ret):
        raise_for(ret, c_name)
    logged()  # the call's own messages: err says why
    if isinstance(err, OverflowError):
        raise invalid("%s: %s" % (what, err)) from None
    raise err


def raise_for(code, what):
    """Raise the exception for C code `code` from call `what`, with the
    messages the library logged on this thread for the failure."""
    cls = error_class(code)
    text = _lib.lib.fabep_strerror(code).decode(errors="replace")
    msg = "%s: %s" % (what, text)
    extra = logged()
    if extra:
        msg += "\n" + extra
    raise cls(code, msg)


class Guard:
    """One thread at a time in a communicator's C calls and those of its
    handles (the library's rule, fabep(7)): another thread's call raises
    InUseError at once instead of racing inside the library (ctypes
    releases the GIL for every call) or waiting behind a call that may
    wait for its peers.  The thread inside may enter again (a finalizer
    the garbage collector runs in the middle of a call)."""

    __slots__ = ("_lock",)

    def __init__(self):
        self._lock = threading.RLock()

    def enter(self, what):
        if not self._lock.acquire(blocking=False):
            raise InUseError("%s: the communicator is in a call on another "
                             "thread (a communicator and its handles are "
                             "used by one thread at a time)" % what)

    def leave(self):
        self._lock.release()

    @contextlib.contextmanager
    def held(self, what):
        """enter(what) for a with-block (a handle's creation)."""
        self.enter(what)
        try:
            yield
        finally:
            self.leave()


def serial(method):
    """A method of a handle with a `_guard` (a Guard), run under it."""
    what = method.__qualname__

    @functools.wraps(method)
    def call(self, *args, **kw):
        # Guard.enter and leave, inlined: this runs on every call
        lock = self._guard._lock
        if not lock.acquire(False):
            self._guard.enter(what)  # raises InUseError
        try:
            return method(self, *args, **kw)
        finally:
            lock.release()
    return call


class Handle:
    """What the package's handles share: `with` closes one, so does the
    garbage collector (its errors dropped: a rank may be gone by then);
    a closed one refuses further calls with InvalidArgumentError.  The
    subclass sets `_h` (None once closed), `_what` (its name in that
    message) and defines close()."""

    _what = "handle"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # in use by another thread: its communicator's close frees it;
        # in a child of fork(), the parent's (as Comm.__del__)
        comm = getattr(self, "comm", None)
        if getattr(comm, "_pid", None) not in (None, os.getpid()):
            return
        if getattr(self, "_h", None) is not None:
            try:
                self.close()
            except Exception:
                pass

    def _handle(self):
        if self._h is None:
            raise invalid("the %s is closed" % self._what)
        return self._h
