# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""ctypes declarations of libfabep's public API (include/fabep.h).

This module loads the C library and declares every function's argument
and result types and every caller-allocated struct.  The rest of the
package wraps these in Python classes; nothing here is public.

The library is found, in this order: the file named by the environment
variable FABEP_LIBRARY (for tests in a build tree, e.g.
src/.libs/libfabep.so); the library installed next to this package
(the libdir that configure baked into _config.py); the system's search
path (ctypes.util.find_library("fabep")).

ctypes.CDLL releases the GIL for the duration of every foreign call, so
a call that waits on the fabric (a dispatch, a barrier, a wait on a
counter) lets the process's other Python threads run; a callback into
Python (the allgather of Comm.from_process_group, a combine row
callback) takes the GIL back while it runs.
"""
import ctypes
import ctypes.util
import os
import signal

c_int = ctypes.c_int
c_uint = ctypes.c_uint
c_size_t = ctypes.c_size_t
c_uint64 = ctypes.c_uint64
c_float = ctypes.c_float
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p
POINTER = ctypes.POINTER


def _candidates():
    env = os.environ.get("FABEP_LIBRARY")
    if env:
        yield env
        return
    try:
        from . import _config
        yield os.path.join(_config.LIBDIR, _config.SONAME)
    except ImportError:
        pass
    found = ctypes.util.find_library("fabep")
    if found:
        yield found


# struct sigaction as bytes (larger than any libc's): saved and set back
# whole; its first member is the handler
_SIGACTION = ctypes.c_char * 512
_libc = ctypes.CDLL(None)
_libc.sigaction.argtypes = [c_int, c_void_p, c_void_p]
_libc.sigaction.restype = c_int


def keep_signals(fn, *args):
    """fn(*args), with the process's signal handlers kept as they were.
    libfabric's psm provider (Debian's and Ubuntu's builds) loads
    libinfinipath, which installs a handler of its own for SIGINT,
    SIGTERM, SIGSEGV, ... that calls exit(1); libfabep then puts the
    default action back (fabep(7)).  Both would take Python's handlers
    (KeyboardInterrupt, faulthandler, a handler of the program's own):
    every handler that changed inside fn is set back as it was."""
    size = ctypes.sizeof(c_void_p)
    before = {}
    for sig in signal.valid_signals():
        sa = _SIGACTION()
        if _libc.sigaction(int(sig), None, sa) == 0:
            before[int(sig)] = sa
    try:
        return fn(*args)
    finally:
        for sig, sa in before.items():
            now = _SIGACTION()
            if (_libc.sigaction(sig, None, now) == 0 and
                    now.raw[:size] != sa.raw[:size]):
                _libc.sigaction(sig, sa, None)


def _load():
    errors = []
    for path in _candidates():
        try:
            return keep_signals(ctypes.CDLL, path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
    raise ImportError("fabep: libfabep not found (%s); install the C library "
                      "or set FABEP_LIBRARY to the path of libfabep.so"
                      % ("; ".join(errors) or "nothing on the search path"))


lib = _load()
lib.fabep_version.restype = c_char_p
lib.fabep_version.argtypes = []
VERSION = lib.fabep_version().decode()
if tuple(int(v) for v in VERSION.split(".")[:2]) < (0, 5):
    raise ImportError("fabep: %s is libfabep %s; this package needs 0.5 or "
                      "later (structs that open with their size, "
                      "fabep_get, fabep_comm_abort, fabep_last_error, "
                      "fabep_log_quiet, and the attribute "
                      "rendezvous_timeout_ms)" % (lib._name, VERSION))


# Every struct the caller allocates opens with `size_t size` (fabep 0.2):
# the *_init() functions set it, and new_output() for the output structs.
ALLGATHER_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_void_p)
ROW_FN = ctypes.CFUNCTYPE(None, c_void_p, c_size_t, c_void_p)


class CommAttr(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("allgather", ALLGATHER_FN),
        ("allgather_ctx", c_void_p),
        ("rank", c_int),
        ("nranks", c_int),
        ("provider", c_char_p),
        ("domain", c_char_p),
        ("signal", c_int),
        ("timeout_ms", c_int),
        ("heap_size", c_size_t),
        ("threads", c_int),
        ("numa_node", c_int),
        ("rendezvous_timeout_ms", c_int),
    ]


class ProviderDesc(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("provider", ctypes.c_char * 64),
        ("fabric", ctypes.c_char * 64),
        ("domain", ctypes.c_char * 64),
        ("caps", c_uint64),
        ("mode", c_uint64),
        ("mr_mode", c_int),
        ("msg_order", c_uint64),
        ("fence", c_int),
        ("delivery_complete", c_int),
        ("atomic_sum_u64", c_int),
        ("atomic_count", c_size_t),
        ("inject_size", c_size_t),
        ("max_msg_size", c_size_t),
        ("rma_iov_limit", c_size_t),
        ("cq_data_size", c_size_t),
        ("signals", c_uint),
        ("signal", c_int),
        ("signal_why", ctypes.c_char * 192),
        ("numa_node", c_int),
    ]


class MoeConfig(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("num_experts", c_int),
        ("top_k", c_int),
        ("hidden", c_size_t),
        ("max_tokens", c_int),
        ("token_type", c_int),
        ("input_type", c_int),
        ("fp8_block", c_int),
        ("combine_type", c_int),
        ("buffer_sets", c_int),
        ("flags", c_uint),
    ]


class MoeRecv(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("rows", c_size_t),
        ("local_experts", c_int),
        ("first_expert", c_int),
        ("x", c_void_p),
        ("scales", c_void_p),
        ("scales_per_row", c_size_t),
        ("row_offsets", c_void_p),
        ("expert_ids", c_void_p),
        ("expert_counts", c_void_p),
        ("src_info", c_void_p),
        ("weights", c_void_p),
        ("row_index", c_void_p),
        ("row_stride", c_size_t),
        ("scale_stride", c_size_t),
    ]


TIMING_FIELDS = ("dispatch_pack_ns", "dispatch_put_ns", "dispatch_wait_ns",
                 "dispatch_build_ns", "combine_reduce_ns", "combine_put_ns",
                 "combine_wait_ns", "combine_sum_ns", "dispatch_wire_bytes",
                 "combine_wire_bytes")


class MoeTiming(ctypes.Structure):
    _fields_ = [("size", c_size_t)] + [(f, c_uint64) for f in TIMING_FIELDS]


class RmsnormParams(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("gamma", c_void_p),
        ("eps", c_float),
        ("weight_offset", c_float),
        ("scale_ub", c_float),
        ("residual", c_void_p),
    ]


def new_output(struct_type):
    """A zeroed output struct with its size member set, as the ABI asks."""
    s = struct_type()
    s.size = ctypes.sizeof(struct_type)
    return s


# Constants of include/fabep.h.
ERR_BASE = 10000
ERR_NAMES = ("MISMATCH", "PEER", "PEER_LOST", "PROTOCOL", "NO_PROVIDER",
             "NO_SIGNAL", "HEAP_FULL", "BUSY")
MOE_FP32, MOE_BF16, MOE_FP8, MOE_FP8_PREQUANT = 0, 1, 2, 3
MOE_MAX_TOPK = 32
MOE_ZERO_COPY = 1
MOE_UNWEIGHTED = 1
AR_F32, AR_BF16 = 0, 1
SIGNALS = ("auto", "ordered", "fence", "delivery", "cqdata", "cma")  # fabep_signal_t




def _decl(name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


P = c_void_p
_decl("fabep_strerror", c_char_p, c_int)
_decl("fabep_last_error", c_char_p)
_decl("fabep_log_quiet", c_int, c_int)
_decl("fabep_version", c_char_p)
_decl("fabep_comm_attr_init", None, POINTER(CommAttr))
_decl("fabep_comm_create", c_int, POINTER(CommAttr), POINTER(P))
_decl("fabep_comm_destroy", c_int, P)
_decl("fabep_comm_abort", None, P)
_decl("fabep_shm_cleanup", c_int, ctypes.c_long)
_decl("fabep_comm_rank", c_int, P)
_decl("fabep_comm_size", c_int, P)
_decl("fabep_comm_provider", c_char_p, P)
_decl("fabep_comm_domain", c_char_p, P)
_decl("fabep_comm_signal", c_int, P)
_decl("fabep_signal_name", c_char_p, c_int)
_decl("fabep_signal_parse", c_int, c_char_p, POINTER(c_int))
_decl("fabep_provider_list", c_int, c_char_p, POINTER(ProviderDesc), c_int,
      POINTER(c_int))
_decl("fabep_barrier", c_int, P)
_decl("fabep_heap_alloc", c_int, P, c_size_t, c_size_t, POINTER(c_uint64))
_decl("fabep_heap_ptr", P, P, c_uint64)
_decl("fabep_heap_size", c_size_t, P)
_decl("fabep_put", c_int, P, c_int, c_uint64, c_uint64, c_size_t)
_decl("fabep_put_signal", c_int, P, c_int, c_uint64, c_uint64, c_size_t,
      c_uint64, c_uint64)
_decl("fabep_get", c_int, P, c_int, c_uint64, c_uint64, c_size_t)
_decl("fabep_flush", c_int, P)
_decl("fabep_wait", c_int, P, c_uint64, c_uint64)
_decl("fabep_counter_read", c_uint64, P, c_uint64)
_decl("fabep_progress", c_int, P)
_decl("fabep_isa", c_int)
_decl("fabep_isa_name", c_char_p, c_int)
_decl("fabep_comm_threads", c_int, P)
_decl("fabep_comm_numa_node", c_int, P)
_decl("fabep_comm_channels", c_int, P)
_decl("fabep_moe_config_init", None, POINTER(MoeConfig))
_decl("fabep_moe_heap_bytes", c_size_t, POINTER(MoeConfig), c_int)
_decl("fabep_moe_create", c_int, P, POINTER(MoeConfig), POINTER(P))
_decl("fabep_moe_destroy", c_int, P)
_decl("fabep_moe_dispatch_send", c_int, P, P, P, c_size_t, P, P)
_decl("fabep_moe_send_buffer", c_int, P, POINTER(P), POINTER(c_size_t),
      POINTER(P), POINTER(c_size_t))
_decl("fabep_moe_dispatch_recv", c_int, P, POINTER(MoeRecv))
_decl("fabep_moe_dispatch", c_int, P, P, P, c_size_t, P, P, POINTER(MoeRecv))
_decl("fabep_moe_combine_send", c_int, P, P, c_size_t, c_uint)
_decl("fabep_moe_combine_recv", c_int, P, P, c_size_t, ROW_FN, P)
_decl("fabep_moe_combine", c_int, P, P, c_size_t, c_uint, P, c_size_t,
      ROW_FN, P)
_decl("fabep_moe_timing", c_int, P, POINTER(MoeTiming))
_decl("fabep_allreduce_heap_bytes", c_size_t, c_size_t, c_size_t, c_int, c_int)
_decl("fabep_allreduce_create", c_int, P, c_size_t, c_size_t, c_int,
      POINTER(P))
_decl("fabep_allreduce_destroy", c_int, P)
_decl("fabep_allreduce_onestage_max", c_size_t, P)
_decl("fabep_allreduce_sum_onestage_max", c_size_t, P)
_decl("fabep_allreduce", c_int, P, P, P, c_size_t, c_size_t)
_decl("fabep_allreduce_rmsnorm_fp8", c_int, P, P, c_size_t, c_size_t,
      POINTER(RmsnormParams), P, P)
_decl("fabep_allreduce_rmsnorm", c_int, P, P, c_size_t, c_size_t,
      POINTER(RmsnormParams), P)
_decl("fabep_rmsnorm_params_init", None, POINTER(RmsnormParams))


def rmsnorm_params():
    """RmsnormParams filled by the library's defaults."""
    p = RmsnormParams()
    lib.fabep_rmsnorm_params_init(ctypes.byref(p))
    return p
