# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""fabep's errors as Python exceptions.

Every failing C call becomes an instance of a FabepError subclass chosen
by its code: ``err.code`` is the negative C code, ``err.strerror`` the
text of fabep_strerror(), and ``str(err)`` that text followed by the
messages the library logged for this failure (for a timeout they name
the peers that never signalled).

The library logs through the C stdio ``stderr`` stream.  To put those
messages into the exception, the package points that stream at a pipe
the first time a communicator is made; a thread copies everything to
the process's real standard error (file descriptor 2) unchanged and
keeps the recent ``fabep[...] error:`` lines.  Python's own sys.stderr
is not touched.  Set FABEP_PY_LOG_CAPTURE=0 to leave stderr alone (the
messages then only go to standard error, and the exception carries the
code's text alone).
"""
import atexit
import builtins
import ctypes
import errno
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
    """-ERANGE: a value out of range (an expert id outside [-1, E))."""


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


class StaleViewError(FabepError):
    """A receive view was read after a later call on its handle."""

    def __init__(self, message):
        super().__init__(-errno.ESTALE, message)


_BY_CODE = {
    errno.EINVAL: InvalidArgumentError,
    errno.ERANGE: RangeError,
    errno.EMSGSIZE: MessageSizeError,
    errno.ENOMEM: NoMemoryError,
    errno.ENOTSUP: NotSupportedError,
    errno.ENOSYS: NotSupportedError,
    errno.ETIMEDOUT: TimeoutError,
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


class _LogCapture:
    """C stderr -> pipe -> fd 2, keeping the library's error lines."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lines = []     # (sequence number, line) of fabep error lines
        self.seq = 0        # lines seen so far
        self.partial = b""
        self.active = False

    def start(self):
        libc = ctypes.CDLL(None)
        var = ctypes.c_void_p.in_dll(libc, "stderr")
        libc.fdopen.restype = ctypes.c_void_p
        libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
        libc.setvbuf.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_int, ctypes.c_size_t]
        libc.fflush.argtypes = [ctypes.c_void_p]
        r, w = os.pipe()
        f = libc.fdopen(w, b"w")
        if not f:
            os.close(r)
            os.close(w)
            return
        libc.setvbuf(f, None, 1, 0)  # _IOLBF: one write per line
        os.set_blocking(r, False)
        self.libc, self.var, self.rfd = libc, var, r
        self.orig, self.file = var.value, f
        libc.fflush(ctypes.c_void_p(self.orig))
        var.value = f
        self.active = True
        t = threading.Thread(target=self._run, name="fabep-log", daemon=True)
        t.start()
        atexit.register(self.stop)

    def _run(self):
        import select
        while self.active:
            try:
                select.select([self.rfd], [], [], 0.2)
            except (OSError, ValueError):
                return
            self.drain()

    def drain(self):
        """Copy what the pipe holds to fd 2 and keep the error lines."""
        with self.lock:
            while True:
                try:
                    data = os.read(self.rfd, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    break
                if not data:
                    break
                try:
                    os.write(2, data)
                except OSError:
                    pass
                data = self.partial + data
                *full, self.partial = data.split(b"\n")
                for line in full:
                    self.seq += 1
                    if line.startswith(b"fabep[") and b" error: " in line:
                        self.lines.append((self.seq, line.decode(
                            errors="replace")))
                del self.lines[:-32]

    def since(self, mark):
        """The error lines logged after mark (drains the pipe first)."""
        if not self.active:
            return []
        self.drain()
        with self.lock:
            return [l for s, l in self.lines if s > mark]

    def stop(self):
        if not self.active:
            return
        self.libc.fflush(ctypes.c_void_p(self.file))
        self.var.value = self.orig
        self.active = False
        self.drain()


log = _LogCapture()


def start_log_capture():
    """Route the library's log into exceptions (see the module's text)."""
    if log.active or os.environ.get("FABEP_PY_LOG_CAPTURE", "1") == "0":
        return
    try:
        log.start()
    except (OSError, ValueError, AttributeError):
        pass


def raise_for(code, what, mark=None):
    """Raise the exception for C code `code` from call `what`."""
    cls = error_class(code)
    text = _lib.lib.fabep_strerror(code).decode(errors="replace")
    logged = log.since(mark) if mark is not None else []
    msg = "%s: %s" % (what, text)
    if logged:
        msg += "\n" + "\n".join(logged)
    raise cls(code, msg)
