# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""Expert parallelism: the MoE handle (dispatch and combine)."""
import collections
import ctypes
import errno

from . import _lib
from . import _tensor
from .comm import _cint, _uint
from .errors import Handle, InvalidArgumentError, StaleViewError, invalid, \
    raise_for, refuse, logged, serial, error_class

lib = _lib.lib
# C's code for a handle that cannot be used any more (fep_ep_usable)
_PEER_LOST = -(_lib.ERR_BASE + 1 + _lib.ERR_NAMES.index("PEER_LOST"))

_TYPES = {"fp32": _lib.MOE_FP32, "bf16": _lib.MOE_BF16, "fp8": _lib.MOE_FP8,
          "fp8_prequant": _lib.MOE_FP8_PREQUANT}
# a flag no library version defines: makes the C combine refuse the call
# on every rank, so a refusal found here never leaves the peers waiting
_BAD_FLAGS = 0x40000000
# topk_ids of a rank with no tokens: an empty tensor may have no address,
# and NULL would mean "the previous routing"
_NO_IDS = (ctypes.c_int32 * _lib.MOE_MAX_TOPK)(*([-1] * _lib.MOE_MAX_TOPK))
_NO_IDS_PTR = ctypes.addressof(_NO_IDS)
_NO_ROW_FN = _lib.ROW_FN()
_EINVAL = -errno.EINVAL

# errors of a send half found in its input after the call counted: the
# exchange still runs to its receive half (the caller's pending checks
# above keep -EINVAL from meaning anything else)

Timing = collections.namedtuple("Timing", _lib.TIMING_FIELDS)
Timing.__doc__ = """Where this rank's last dispatch and combine spent their
time (ns) and the bytes each wrote to other ranks (fabep_moe_timing)."""


def _type(name, what, allowed):
    if not isinstance(name, str) or name not in allowed:
        raise invalid("%s=%r: expected one of %s" % (
            what, name, ", ".join(allowed)))
    return _TYPES[name]


class RecvView:
    """What a dispatch delivered to this rank (fabep_moe_recv_t).

    Every array attribute views memory of the library without a copy, as
    a torch tensor or a numpy array (the kind of the dispatch's input,
    or MoE's `output`).  They are valid until the next call on the same
    MoE handle (dispatch, combine or one of their halves): reading an
    attribute of this view after that raises StaleViewError, and arrays
    taken from it earlier then hold whatever the library wrote since.
    Copy what must live longer.

    rows            rows received (int)
    local_experts   E / ranks; first_expert: global id of local expert 0
    x               the rows, [rows, hidden] of the token type (FP8: uint8
                    codes) in expert-major order; with zero_copy the
                    receive slots [slots, hidden] as they landed (rows
                    row_stride bytes apart), row r being x[row_index[r]]
    scales          FP8: fp32 [rows (or slots), scales_per_row], else None
    row_offsets     [local_experts + 1]: local expert i has rows
                    row_offsets[i]:row_offsets[i + 1]  (uint32; int32 in torch)
    expert_ids      [local_experts] int32: global id of each group
    expert_counts   [local_experts]: rows per local expert
    src_info        [rows, 3] int32: source rank, token index, k
    weights         [rows] fp32: the router weight of each row
    row_index       [rows] int32: the slot row of expert-major row r
    """

    _SCALARS = ("local_experts", "first_expert", "scales_per_row",
                "row_stride", "scale_stride")
    __slots__ = ("_moe", "_gen", "_kind", "_rec", "_cache", "rows",
                 "local_experts", "first_expert", "scales_per_row",
                 "row_stride", "scale_stride")

    def __init__(self, moe, rec, kind):
        self._moe = moe
        self._gen = moe._gen
        self._kind = kind
        self._rec = rec
        self._cache = None
        self.rows = rec.rows

    def __getattr__(self, name):
        # called for what is not set yet: the scalars before their first
        # read, and every array (made once, then kept in _cache)
        make = _MAKE.get(name)
        if make is None:
            if name not in RecvView._SCALARS:
                raise AttributeError(name)
            if self._cache is None:
                self._scalars()
            return object.__getattribute__(self, name)
        m = self._moe
        if self._gen != m._gen or m._h is None:
            raise StaleViewError(
                "RecvView.%s: the view's MoE handle has made a call since "
                "this dispatch (or was closed); its rows are no longer "
                "this dispatch's" % name)
        c = self._cache
        if c is None:
            self._scalars()
            c = self._cache
        if name not in c:
            c[name] = make(self, m, self._rec, self._kind)
        return c[name]

    def _scalars(self):
        if not self.valid():
            raise StaleViewError("RecvView: read its fields before the next "
                                 "call on its handle")
        r = self._rec
        self.local_experts = r.local_experts
        self.first_expert = r.first_expert
        self.scales_per_row = r.scales_per_row
        self.row_stride = r.row_stride
        self.scale_stride = r.scale_stride
        self._cache = {}

    def valid(self):
        """True while no later call on the handle has been made."""
        return self._gen == self._moe._gen and self._moe._h is not None

    def _slots(self):
        m = self._moe
        if not m.zero_copy or not self.rows:
            return self.rows
        idx = _tensor.view("numpy", self._rec.row_index, (self.rows,), "i32",
                           m)
        return int(idx.max()) + 1

    def offsets(self):
        """row_offsets as a list of Python ints (for slicing by expert)."""
        return _tensor.view(
            "numpy", self._rec.row_offsets, (self.local_experts + 1,), "u32",
            self._moe).tolist() if self.valid() else self.row_offsets

    def __repr__(self):
        return "<fabep.RecvView rows=%d%s>" % (
            self.rows, "" if self.valid() else " stale")


def _make_scales(v, m, r, k):
    if not v.scales_per_row:
        return None
    if not r.scales:  # no rows here: an empty array all the same
        return _tensor.view(k, 0, (0, v.scales_per_row), "fp32", m)
    return _tensor.view(k, r.scales, (v._slots(), v.scales_per_row), "fp32",
                        m, row_stride=4 * (v.scale_stride or
                                           v.scales_per_row))


# RecvView's arrays: name -> make(view, handle, record, kind); the view's
# scalars are read before any of them is made
_MAKE = {
    "x": lambda v, m, r, k: _tensor.view(k, r.x, (v._slots(), m.hidden),
                                         m._row_dt, m,
                                         row_stride=v.row_stride or None),
    "scales": _make_scales,
    "row_offsets": lambda v, m, r, k: _tensor.view(
        k, r.row_offsets, (v.local_experts + 1,), "u32", m),
    "expert_ids": lambda v, m, r, k: _tensor.view(
        k, r.expert_ids, (v.local_experts,), "i32", m),
    "expert_counts": lambda v, m, r, k: _tensor.view(
        k, r.expert_counts, (v.local_experts,), "u32", m),
    "src_info": lambda v, m, r, k: _tensor.view(k, r.src_info, (v.rows, 3),
                                                "i32", m),
    "weights": lambda v, m, r, k: _tensor.view(k, r.weights, (v.rows,),
                                               "fp32", m),
    "row_index": lambda v, m, r, k: _tensor.view(k, r.row_index, (v.rows,),
                                                 "i32", m),
}


class MoE(Handle):
    """A MoE dispatch/combine handle (fabep_moe_create).  Collective.

    Experts are split in equal contiguous blocks: rank r owns experts
    [r * E / size, (r + 1) * E / size).  Every call on the handle is
    collective (every rank makes the same sequence of calls).

    num_experts, top_k, hidden, max_tokens: the sizes; every rank passes
    the same.  token_type: what travels, "bf16" (default), "fp32", "fp8"
    (quantized during dispatch from rows of input_type "bf16" or "fp32",
    one fp32 scale per token, or per fp8_block values) or "fp8_prequant"
    (uint8 e4m3fn rows the caller quantized, with their fp32 scales).
    combine_type: "bf16" (default) or "fp32", the expert outputs and the
    combine output.  buffer_sets: dispatches that may be outstanding
    (0 = 2).  zero_copy: leave the received rows in the receive slots
    (RecvView.row_index).  output: "torch" or "numpy" for the receive
    view's arrays (default: the kind of the last dispatch's input).

    Inputs are torch CPU tensors or numpy arrays, checked for dtype,
    shape, contiguity, device and layout (dense, without torch's
    negative or conjugate bit) before anything is sent; a refusal is
    passed to the C call so that every rank raises the same error class
    (the refusing rank with the reason, the others with the code) and
    none waits.  Nothing is copied on the way in.
    """

    _what = "MoE handle"

    def __init__(self, comm, num_experts, top_k, hidden, max_tokens, *,
                 token_type="bf16", input_type=None, fp8_block=0,
                 combine_type="bf16", buffer_sets=0, zero_copy=False,
                 output=None):
        self._h = None
        self.comm = comm
        self._guard = comm._guard
        try:
            if output not in (None, "torch", "numpy"):
                raise invalid("output=%r: expected 'torch' or 'numpy'"
                              % (output,))
            cfg = self._config(num_experts, top_k, hidden, max_tokens,
                               token_type, input_type, fp8_block,
                               combine_type, buffer_sets, zero_copy)
        except (InvalidArgumentError, TypeError, OverflowError) as e:
            self._refuse_create(comm, e)
        self.num_experts, self.top_k = num_experts, top_k
        self.hidden, self.max_tokens = hidden, max_tokens
        self.token_type, self.combine_type = token_type, combine_type
        self.fp8_block, self.zero_copy = fp8_block, bool(zero_copy)
        fp8 = token_type in ("fp8", "fp8_prequant")
        self.input_type = ((input_type or "bf16") if token_type == "fp8"
                           else None)
        self._x_dt = {"fp32": "fp32", "bf16": "bf16", "fp8": self.input_type,
                      "fp8_prequant": "u8"}[token_type]
        self._row_dt = "u8" if fp8 else token_type
        self.scales_per_row = (0 if not fp8 else 1 if not fp8_block else
                               -(-hidden // fp8_block))
        self._output = output
        self._kind = output or "torch"
        self._gen = 0
        self._sent = collections.deque()      # n per dispatch sent
        self._received = collections.deque()  # (n, rows) received, uncombined
        self._csent = collections.deque()     # (n, rows) per combine sent
        self._sendbuf = None
        self._ft = None  # torch dtypes of the fast paths (_fast_types)
        # the C call whose outcome an exception hid (_begin): set before
        # each C call of a dispatch or combine, cleared once what it did is
        # recorded above
        self._unknown = None
        h = ctypes.c_void_p()
        with self._guard.held("MoE"):
            ret = lib.fabep_moe_create(comm._handle(), ctypes.byref(cfg),
                                       ctypes.byref(h))
            if ret:
                raise_for(ret, "fabep_moe_create")
            self._h = h.value
            self._key = comm._adopt(self, "fabep_moe_destroy", h.value)
        self._recv = _lib.new_output(_lib.MoeRecv)
        self._recv_ref = ctypes.byref(self._recv)

    @staticmethod
    def _config(num_experts, top_k, hidden, max_tokens, token_type="bf16",
                input_type=None, fp8_block=0, combine_type="bf16",
                buffer_sets=0, zero_copy=False):
        cfg = _lib.MoeConfig()
        lib.fabep_moe_config_init(ctypes.byref(cfg))
        # ctypes would keep the low bits of a value its field cannot
        # hold, and the C handle would differ from this object without a
        # word; a negative int is C's to refuse, on every rank
        for k, v in (("num_experts", num_experts), ("top_k", top_k),
                     ("max_tokens", max_tokens), ("fp8_block", fp8_block),
                     ("buffer_sets", buffer_sets)):
            _cint(v, k)
        _uint(hidden, "hidden")
        cfg.num_experts, cfg.top_k = num_experts, top_k
        cfg.hidden, cfg.max_tokens = hidden, max_tokens
        cfg.token_type = _type(token_type, "token_type", _TYPES)
        if token_type == "fp8":
            cfg.input_type = _type(input_type or "bf16", "input_type",
                                   ("fp32", "bf16"))
        cfg.fp8_block = fp8_block
        cfg.combine_type = _type(combine_type, "combine_type",
                                 ("fp32", "bf16"))
        cfg.buffer_sets = buffer_sets
        cfg.flags = _lib.MOE_ZERO_COPY if zero_copy else 0
        return cfg

    def _refuse_create(self, comm, err):
        """Pass a configuration refused here to every rank: the C create
        with a token type it refuses fails with -EINVAL on every rank, so
        none waits for this one; this rank raises err (its reason)."""
        cfg = _lib.MoeConfig()
        lib.fabep_moe_config_init(ctypes.byref(cfg))
        cfg.token_type = -1
        h = ctypes.c_void_p()
        with self._guard.held("MoE"):
            refuse("MoE", err, lambda: lib.fabep_moe_create(
                comm._handle(), ctypes.byref(cfg), ctypes.byref(h)),
                lambda ret: ret == 0 and lib.fabep_moe_destroy(h))

    @staticmethod
    def heap_bytes(nranks, num_experts, top_k, hidden, max_tokens, **kw):
        """Symmetric-heap bytes a handle of this configuration takes on
        `nranks` ranks (add it to Comm's heap_size).  Same keywords as
        MoE()."""
        kw.pop("output", None)
        cfg = MoE._config(num_experts, top_k, hidden, max_tokens, **kw)
        n = lib.fabep_moe_heap_bytes(ctypes.byref(cfg),
                                     _cint(nranks, "nranks"))
        if not n:
            raise invalid("MoE.heap_bytes: no handle of this configuration "
                          "on %d ranks (fabep_moe_heap_bytes gave 0)"
                          % nranks)
        return n

    @serial
    def close(self):
        """Free the handle (not collective).  Views of it (the receive
        view's arrays, the send buffer) must not be used afterwards: the
        memory they show is freed."""
        if self._h is None:
            return
        self._h = None
        self._gen += 1
        self.comm._release(self._key)
        logged()  # not raised: its messages must not reach a later error

    def _handle(self):
        h = super()._handle()
        if self._unknown:
            raise error_class(_PEER_LOST)(_PEER_LOST, (
                "%s: an exception (a signal handler's, such as "
                "KeyboardInterrupt) ended %s as its C call returned, so what "
                "that call did is unknown here and the handle is unusable: "
                "close it (the peers' next call may time out)")
                % (self._what, self._unknown))
        return h

    def _begin(self, what):
        """Before a C call whose outcome the bookkeeping after it records:
        Python raises a pending signal handler's exception (Ctrl-C's
        KeyboardInterrupt) as the call returns, before that bookkeeping,
        so the mark stays until the caller clears it (self._unknown =
        None) and, where it stays, later calls refuse (_handle)."""
        self._unknown = what

    # -- input checks ---------------------------------------------------------
    def _fast_types(self):
        """(int32, float32, the rows' input dtype, combine_type) as torch
        dtypes, once torch is loaded: what the fast paths compare with."""
        ft = self._ft
        if ft is None:
            ft = self._ft = _tensor.torch_dtypes("i32", "fp32", self._x_dt,
                                                 self.combine_type)
        return ft

    def _fast_dispatch(self, x, ids, w, scales):
        """(pointers, n) where the inputs are what a server passes on
        every call: contiguous torch CPU tensors (not subclasses) of the
        expected dtypes and shapes, weights given, a token type without
        the caller's scales, x not the send buffer's rows.  Else None, and
        _check_dispatch, which takes every case and names what is wrong,
        decides."""
        T = _tensor._TENSOR  # None until torch is loaded
        if type(ids) is not T or type(x) is not T or type(w) is not T or \
                scales is not None or self._sendbuf is not None or \
                self._x_dt == "u8":  # fp8_prequant: scales required
            return None
        i32, f32, xdt, _ = self._ft or self._fast_types()
        s = ids.shape
        if len(s) != 2 or s[1] != self.top_k:
            return None
        n = s[0]
        if n > self.max_tokens or ids.dtype is not i32 or \
                x.dtype is not xdt or w.dtype is not f32 or \
                x.shape != (n, self.hidden) or w.shape != s or \
                not (ids.is_cpu and x.is_cpu and w.is_cpu and
                     ids.is_contiguous() and x.is_contiguous() and
                     w.is_contiguous()) or \
                ids.is_neg() or x.is_neg() or w.is_neg():
            return None
        try:
            return (x.data_ptr(), None, ids.data_ptr() or _NO_IDS_PTR,
                    w.data_ptr()), n
        except RuntimeError:  # no storage (sparse, mkldnn): check() refuses
            return None

    def _fast_combine(self, y, out):
        """(y's pointer, out's pointer) where both are contiguous torch CPU
        tensors (not subclasses) of combine_type and the shapes of the
        dispatch being combined; else None (_check_y and _check_out
        decide)."""
        T = _tensor._TENSOR
        if type(y) is not T or type(out) is not T or not self._received:
            return None
        cdt = (self._ft or self._fast_types())[3]
        n, rows = self._received[0]
        if y.dtype is not cdt or out.dtype is not cdt or \
                y.shape != (rows, self.hidden) or \
                out.shape != (n, self.hidden) or \
                not (y.is_cpu and out.is_cpu and y.is_contiguous() and
                     out.is_contiguous()) or y.is_neg() or out.is_neg():
            return None
        try:
            return y.data_ptr(), out.data_ptr()
        except RuntimeError:  # no storage (sparse, mkldnn): check() refuses
            return None

    def _check_dispatch(self, x, topk_ids, topk_weights, scales):
        if topk_ids is None:
            if not hasattr(self, "_last_n"):
                raise invalid("topk_ids: None reuses the previous "
                              "dispatch's routing, and there was none")
            n = self._prev_n
        else:
            ids = _tensor.check(topk_ids, "topk_ids", ("i32",),
                                (None, self.top_k))
            n = ids.shape[0]
        if n > self.max_tokens:
            # the C call reports it on every rank (-EMSGSIZE)
            return (_ptr(x), None, _ptr(topk_ids), None), n
        xa = None
        if x is not None:
            sb = self._sendbuf
            strided = sb is not None and _tensor.kind_of(x) is not None and \
                _ptr(x) == sb[0]
            xa = _tensor.check(x, "x", (self._x_dt,), (n, self.hidden),
                               rows_strided=strided)
            if strided and xa.ld * _tensor.ITEMSIZE[self._x_dt] not in \
                    (sb[1], self.hidden * _tensor.ITEMSIZE[self._x_dt]):
                raise invalid("x: the send buffer's rows are "
                              "%d bytes apart" % sb[1])
            self._kind = self._output or xa.kind
        elif n:
            raise invalid("x: None with %d tokens" % n)
        sa = None
        if self.token_type == "fp8_prequant":
            if scales is None:
                if n:
                    raise invalid("scales: fp8_prequant needs "
                                  "the scales")
            else:
                # rows apart only as the send buffer's scales are (C
                # takes their stride from there, not from the input)
                sb = self._sendbuf
                strided = sb is not None and sb[2] and \
                    _tensor.kind_of(scales) is not None and \
                    _ptr(scales) == sb[2]
                sa = _tensor.check(scales, "scales", ("fp32",),
                                   (n, self.scales_per_row),
                                   rows_strided=strided)
                if strided and sa.ld not in (sb[3], self.scales_per_row):
                    raise invalid("scales: the send buffer's rows are "
                                  "%d floats apart" % sb[3])
        elif scales is not None:
            raise invalid("scales: only fp8_prequant takes "
                          "scales")
        wp = None
        if topk_weights is not None:
            if topk_ids is None:
                raise invalid("topk_weights without topk_ids "
                              "(None reuses the previous routing "
                              "and weights)")
            wp = _tensor.check(topk_weights, "topk_weights", ("fp32",),
                               (n, self.top_k)).ptr
        return (xa.ptr if xa else None, sa.ptr if sa else None,
                (ids.ptr or _NO_IDS_PTR) if topk_ids is not None else None,
                wp), n

    def _refuse_dispatch(self, err):
        """Pass a refusal found here to every rank: the C dispatch with
        tokens but no rows fails with -EINVAL on every rank."""
        rp = ctypes.byref(self._recv)
        self._begin("dispatch")

        def settle(ret):
            self._unknown = None
            self._gen += 1
        refuse("dispatch", err, lambda: lib.fabep_moe_dispatch(
            self._h, None, None, 1, _NO_IDS_PTR, None, rp), settle,
            "fabep_moe_dispatch")

    @property
    def _prev_n(self):
        return getattr(self, "_last_n", 0)

    # -- dispatch -------------------------------------------------------------
    @serial
    def dispatch(self, x, topk_ids, topk_weights=None, scales=None):
        """Send each token to the ranks of its top-k experts and return
        what this rank received (a RecvView).  Collective.

        x: [n, hidden] of the input dtype (bf16 / fp32 tokens: bf16 as
        torch.bfloat16 or numpy uint16, fp32; "fp8": input_type; 
        "fp8_prequant": uint8 codes with `scales` fp32 [n, scales_per_row]);
        topk_ids: int32 [n, top_k], -1 = not routed, None = the previous
        dispatch's routing and weights (the backward of combine);
        topk_weights: fp32 [n, top_k] or None (all 1).  0 <= n <=
        max_tokens.  The inputs may be reused as soon as this returns.
        """
        h = self._h
        if h is None or self._unknown is not None:
            self._handle()  # raises
        fast = self._fast_dispatch(x, topk_ids, topk_weights, scales)
        if fast is not None:
            args, n = fast
            self._kind = self._output or "torch"
        else:
            try:
                args, n = self._check_dispatch(x, topk_ids, topk_weights,
                                               scales)
            except InvalidArgumentError as e:
                self._refuse_dispatch(e)
        xp, sp, ip, wp = args
        self._gen += 1
        self._sendbuf = None  # valid for one call (send_buffer)
        self._unknown = "dispatch"  # self._begin, inlined on this path
        ret = lib.fabep_moe_dispatch(h, xp, sp, n, ip, wp, self._recv_ref)
        if not ret:
            self._last_n = n
            self._received.append((n, self._recv.rows))
        self._unknown = None
        if ret:
            raise_for(ret, "fabep_moe_dispatch")
        return self._view()

    @serial
    def dispatch_send(self, x, topk_ids, topk_weights=None, scales=None):
        """Send half of dispatch (see dispatch): returns once the rows are
        on their way, so the caller can compute while they travel; then
        dispatch_recv().  x may be the send buffer's rows (send_buffer)."""
        h = self._handle()
        if self._sent:
            raise invalid("dispatch_send: the previous "
                          "dispatch_send awaits its dispatch_recv")
        try:
            args, n = self._check_dispatch(x, topk_ids, topk_weights, scales)
        except InvalidArgumentError as e:
            self._refuse_dispatch(e)
        self._gen += 1
        self._sendbuf = None
        self._begin("dispatch_send")
        ret = lib.fabep_moe_dispatch_send(h, args[0], args[1], n, args[2],
                                          args[3])
        if not ret:
            self._sent.append(n)
        self._unknown = None
        if ret:
            # a refused send half has completed the call with every
            # rank (the peers' dispatch_recv raises the same error):
            # nothing is owed
            raise_for(ret, "fabep_moe_dispatch_send")
        return None

    @serial
    def dispatch_recv(self):
        """Receive half of dispatch: wait for every peer's rows and return
        the RecvView."""
        h = self._handle()
        self._gen += 1
        rp = ctypes.byref(self._recv)
        self._begin("dispatch_recv")
        ret = lib.fabep_moe_dispatch_recv(h, rp)
        n = self._sent.popleft() if self._sent else 0
        if not ret:
            self._last_n = n  # a refused dispatch's routing is not kept
            self._received.append((n, self._recv.rows))
        self._unknown = None
        if ret:
            raise_for(ret, "fabep_moe_dispatch_recv")
        return self._view()

    def _view(self):
        # the view reads the handle's record itself: any later call bumps
        # _gen, which the view checks before it reads
        return RecvView(self, self._recv, self._kind)

    @serial
    def send_buffer(self, kind=None):
        """Registered memory where the next dispatch_send finds its tokens
        without a copy: returns (x, scales), x [max_tokens, hidden] of the
        input dtype (rows possibly apart: write token t into x[t]) and,
        for fp8_prequant, scales [max_tokens, scales_per_row] (else None).
        Pass x[:n] (and scales[:n]) to dispatch_send.  Valid for that one
        call.  Not for token_type "fp8" (NotSupportedError).  kind: "torch" or
        "numpy" (default: the handle's output kind)."""
        h = self._handle()
        xp, stride = ctypes.c_void_p(), ctypes.c_size_t()
        sp, sstride = ctypes.c_void_p(), ctypes.c_size_t()
        ret = lib.fabep_moe_send_buffer(h, ctypes.byref(xp),
                                        ctypes.byref(stride), ctypes.byref(sp),
                                        ctypes.byref(sstride))
        if ret:
            raise_for(ret, "fabep_moe_send_buffer")
        if kind not in (None, "torch", "numpy"):
            raise invalid("kind=%r: expected 'torch' or 'numpy'" % (kind,))
        kind = kind or self._output or self._kind
        x = _tensor.view(kind, xp.value, (self.max_tokens, self.hidden),
                         self._x_dt, self, row_stride=stride.value)
        s = None
        if sp.value:
            s = _tensor.view(kind, sp.value, (self.max_tokens,
                                              self.scales_per_row), "fp32",
                             self, row_stride=4 * sstride.value)
        self._sendbuf = (xp.value, stride.value, sp.value, sstride.value)
        return x, s

    # -- combine --------------------------------------------------------------
    def _check_y(self, y):
        rows = self._received[0][1] if self._received else None
        if y is None:
            if rows:
                raise invalid("y: None for %d rows" % rows)
            return None, self.hidden
        a = _tensor.check(y, "y", (self.combine_type,), (rows, self.hidden),
                          rows_strided=True)
        return a.ptr, a.ld

    def _check_out(self, out, n, like):
        """like: a kind name, or the input whose kind a new out takes."""
        if out is None:
            if not isinstance(like, str):
                like = _tensor.kind_of(like) or self._kind
            out = _tensor.empty(like, (n, self.hidden), self.combine_type)
        a = _tensor.check(out, "out", (self.combine_type,), (n, self.hidden),
                          rows_strided=True, written=True)
        return out, a.ptr, a.ld

    def _refuse_combine(self, err):
        """Pass a refusal found here to every rank: the C combine with
        flags it refuses fails with -EINVAL on every rank."""
        self._gen += 1
        no_cb = _lib.ROW_FN()
        self._begin("combine")

        def settle(ret):
            # a refused combine leaves its dispatch received on every
            # rank; another failure (a peer lost) ends it
            if ret and ret != -errno.EINVAL and self._received:
                self._received.popleft()
            self._unknown = None
        refuse("combine", err, lambda: lib.fabep_moe_combine(
            self._h, None, 0, _BAD_FLAGS, None, 0, no_cb, None), settle,
            "fabep_moe_combine")

    @serial
    def combine(self, y, out=None, weighted=True, row_callback=None):
        """Bring the expert outputs back and sum them per token with the
        router weights (weighted=False: a plain sum, the backward of
        dispatch).  Collective; combines the oldest dispatch not yet
        combined.

        y: [rows, hidden] of combine_type (torch.bfloat16 / numpy uint16,
        or fp32) in the order the dispatch delivered; its rows may be
        apart (y[:, :hidden] of a wider tensor).  out: [n, hidden] of
        combine_type (n of that dispatch), or None for a new one of the
        kind of y.  row_callback(token, row) is called once per finished
        row (from the library's worker threads, holding the GIL while it
        runs; an exception in it is raised after the call).  Returns out.
        An argument refused on any rank raises InvalidArgumentError on
        every rank and leaves the dispatch to be combined again.
        """
        h = self._h
        if h is None or self._unknown is not None:
            self._handle()  # raises
        fast = self._fast_combine(y, out)
        if fast is not None:
            yp, op = fast
            ld_y = ld_out = self.hidden
        else:
            n = self._received[0][0] if self._received else 0
            try:
                yp, ld_y = self._check_y(y)
                out, op, ld_out = self._check_out(out, n, y)
            except InvalidArgumentError as e:
                self._refuse_combine(e)
        if row_callback is None:
            cb, holder = _NO_ROW_FN, None
        else:
            cb, holder = self._row_cb(row_callback, out)
        self._gen += 1
        flags = 0 if weighted else _lib.MOE_UNWEIGHTED
        self._unknown = "combine"  # self._begin, inlined on this path
        ret = lib.fabep_moe_combine(h, yp, ld_y, flags, op, ld_out, cb, None)
        # a refused combine (-EINVAL on every rank) leaves its dispatch
        # received, for the next combine
        if self._received and ret != _EINVAL:
            self._received.popleft()
        self._unknown = None
        if ret:
            raise_for(ret, "fabep_moe_combine")
        if holder and holder[0] is not None:
            raise holder[0]
        return out

    @serial
    def combine_send(self, y, weighted=True):
        """Send half of combine (see combine): reduce this rank's expert
        outputs per token and send them back (or send them back as they
        are, where their source asked for that: FABEP_MOE_COMBINE_ROWS);
        then combine_recv().  y may be reused as soon as this returns."""
        h = self._handle()
        if self._csent:
            raise invalid("combine_send: the previous "
                          "combine_send awaits its combine_recv")
        try:
            yp, ld_y = self._check_y(y)
        except InvalidArgumentError as e:
            self._refuse_combine(e)
        self._gen += 1
        flags = 0 if weighted else _lib.MOE_UNWEIGHTED
        self._begin("combine_send")
        ret = lib.fabep_moe_combine_send(h, yp, ld_y, flags)
        if not ret:
            self._csent.append(self._received.popleft() if self._received
                               else (0, 0))
        elif ret != -errno.EINVAL and self._received:
            # as in dispatch_send: a refused send half owes nothing, and
            # a refused combine (-EINVAL) keeps its dispatch received
            self._received.popleft()
        self._unknown = None
        if ret:
            raise_for(ret, "fabep_moe_combine_send")
        self._ylike = _tensor.kind_of(y) or self._kind

    @serial
    def combine_recv(self, out=None, row_callback=None):
        """Receive half of combine: wait for the partial rows (or rows)
        and sum them into out ([n, hidden] of combine_type, or None for a new one).
        A bad `out` raises on this rank alone before anything is
        consumed (the combine stays pending: call again), as in C."""
        h = self._handle()
        n = self._csent[0][0] if self._csent else 0
        out, op, ld_out = self._check_out(out, n, getattr(self, "_ylike",
                                                          self._kind))
        cb, holder = self._row_cb(row_callback, out)
        self._gen += 1
        self._begin("combine_recv")
        ret = lib.fabep_moe_combine_recv(h, op, ld_out, cb, None)
        sent = self._csent.popleft() if self._csent else None
        if ret == -errno.EINVAL and sent:
            # refused on some rank: the dispatch stays received
            self._received.appendleft(sent)
        self._unknown = None
        if ret:
            raise_for(ret, "fabep_moe_combine_recv")
        if holder and holder[0] is not None:
            raise holder[0]
        return out

    def _row_cb(self, fn, out):
        if fn is None:
            return _NO_ROW_FN, None
        holder = [None]

        def cb(ctx, token, row):
            try:
                fn(token, out[token])
            except BaseException as e:  # noqa: B902 - raised after the call
                if holder[0] is None:
                    holder[0] = e
        c = _lib.ROW_FN(cb)
        holder.append(c)
        return c, holder

    # -- backward -------------------------------------------------------------
    def combine_backward(self, grad_out):
        """The backward of combine: dispatch the output gradient
        [n, hidden] with the previous dispatch's routing and weights;
        returns the RecvView of the gradient rows."""
        return self.dispatch(grad_out, None)

    def dispatch_backward(self, grad_rows, out=None):
        """The backward of dispatch: send the gradient of the received
        rows back and sum them per token without weights."""
        return self.combine(grad_rows, out=out, weighted=False)

    @serial
    def timing(self):
        """Timing of this rank's last dispatch and combine (not collective)."""
        t = _lib.new_output(_lib.MoeTiming)
        ret = lib.fabep_moe_timing(self._handle(), ctypes.byref(t))
        if ret:
            raise_for(ret, "fabep_moe_timing")
        return Timing(*(getattr(t, f) for f in _lib.TIMING_FIELDS))


def _ptr(a):
    k = _tensor.kind_of(a)
    if k == "torch":
        return a.data_ptr()
    if k == "numpy":
        return a.__array_interface__["data"][0]
    return None
