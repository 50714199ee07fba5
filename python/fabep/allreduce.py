# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""Collectives: allreduce, allreduce + RMSNorm (+ FP8)."""
import ctypes

from . import _lib
from . import _tensor
from .comm import _cint, _uint
from .errors import Handle, InvalidArgumentError, invalid, raise_for, logged, \
    refuse, serial

lib = _lib.lib
_DT = {"fp32": _lib.AR_F32, "bf16": _lib.AR_BF16}


def _check_shape(max_rows, max_cols, dtype):
    """A handle's sizes and dtype, before any C call (ctypes would wrap
    a negative size around)."""
    if not isinstance(dtype, str) or dtype not in _DT:
        raise invalid("dtype=%r: expected bf16 or fp32" % (dtype,))
    for k, v in (("max_rows", max_rows), ("max_cols", max_cols)):
        if _uint(v, k) < 1:
            raise invalid("%s=%d: expected at least 1" % (k, v))


def _real(name, v):
    """v as a float for a C float field, or InvalidArgumentError (so the
    refusal reaches every rank, not a TypeError on this one)."""
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        raise invalid("%s: expected a real number, got %r" % (name, v)) \
            from None


class AllReduce(Handle):
    """An allreduce handle for [rows, cols] tensors of up to max_rows x
    max_cols elements of dtype "bf16" (torch.bfloat16 / numpy uint16) or
    "fp32" (fabep_allreduce_create).  Collective.

    Sums are taken in fp32 and rounded once, so every rank gets bitwise
    the same result: in rank order, or for small calls from 4 ranks in
    the fixed tree order of the log-step path (fabep_allreduce(3)).
    Inputs are checked for dtype, shape, contiguity, device and layout
    (dense, without torch's negative or conjugate bit); a refusal is
    passed to the C call (as a missing buffer, with the rows
    and cols of the refused input, or else of the last call) so every
    rank raises InvalidArgumentError, none waits and the handle stays
    usable.  Outputs are the caller's (`out`) or new tensors of the kind
    of the input.
    """

    _what = "AllReduce handle"

    def __init__(self, comm, max_rows, max_cols, dtype="bf16"):
        self._h = None
        self.comm, self.dtype = comm, dtype
        self._guard = comm._guard
        try:
            _check_shape(max_rows, max_cols, dtype)
        except InvalidArgumentError as e:
            # the C create with a dtype it refuses fails on every rank,
            # so none waits for this one; this rank raises the reason
            h = ctypes.c_void_p()
            with self._guard.held("AllReduce"):
                refuse("AllReduce", e, lambda: lib.fabep_allreduce_create(
                    comm._handle(), 1, 1, -1, ctypes.byref(h)),
                    lambda ret: ret == 0 and lib.fabep_allreduce_destroy(h))
        self.max_rows, self.max_cols = max_rows, max_cols
        self._last = (1, max_cols)   # the last call's rows and cols
        self._tdt = None             # torch dtypes of the fast path (_fast)
        self._p = _lib.rmsnorm_params()  # the norms' parameters, refilled
        self._pref = ctypes.byref(self._p)
        h = ctypes.c_void_p()
        with self._guard.held("AllReduce"):
            ret = lib.fabep_allreduce_create(comm._handle(), max_rows,
                                             max_cols, _DT[dtype],
                                             ctypes.byref(h))
            if ret:
                raise_for(ret, "fabep_allreduce_create")
            self._h = h.value
            self._key = comm._adopt(self, "fabep_allreduce_destroy", h.value)

    @staticmethod
    def heap_bytes(nranks, max_rows, max_cols, dtype="bf16"):
        """Symmetric-heap bytes one handle takes (add it to Comm's
        heap_size)."""
        _check_shape(max_rows, max_cols, dtype)
        n = lib.fabep_allreduce_heap_bytes(max_rows, max_cols, _DT[dtype],
                                           _cint(nranks, "nranks"))
        if not n:
            raise invalid("AllReduce.heap_bytes: no handle of %d x %d %s on "
                          "%d ranks (fabep_allreduce_heap_bytes gave 0)"
                          % (max_rows, max_cols, dtype, nranks))
        return n

    @property
    def onestage_max(self):
        """The threshold of the RMSNorm calls, in input bytes per rank:
        calls up to it take the one-stage path (2 or 3 ranks) or the
        log-step path (4 ranks or more), larger ones the two-stage
        path."""
        return lib.fabep_allreduce_onestage_max(self._handle())

    @property
    def sum_onestage_max(self):
        """The same threshold of allreduce(): larger than onestage_max
        on 2 ranks, where the one-stage path is the faster for a plain
        sum of any size up to it."""
        return lib.fabep_allreduce_sum_onestage_max(self._handle())

    @serial
    def close(self):
        """Free the handle (not collective)."""
        if self._h is not None:
            self._h = None
            self.comm._release(self._key)
            logged()  # not raised: its messages must not reach a later error

    def _shape(self, x):
        """The rows and cols of this rank's call as the other ranks
        likely pass them: x's, where x is a 2-D tensor whatever its
        faults, clamped to the handle's; else the last call's.  A
        refusal takes the path these choose, as the other ranks do from
        theirs: from 4 ranks, ranks whose sizes fall on the two sides of
        the log-step threshold cost one more exchange to put the path's
        counters back in step (fabep_allreduce(3))."""
        shape = getattr(x, "shape", None)
        try:
            rows, cols = (int(v) for v in shape)
        except (TypeError, ValueError):
            return self._last
        return (min(max(rows, 1), self.max_rows),
                min(max(cols, 1), self.max_cols))

    def _refuse(self, err, call, x):
        """Make the C call with no input buffer, with x's rows and cols
        (_shape): every rank fails with -EINVAL, none waits, the handle
        stays usable; this rank raises its own reason."""
        rows, cols = self._shape(x)
        p = _lib.rmsnorm_params()
        p.scale_ub = 1.0
        if call == "plain":
            def c():
                return lib.fabep_allreduce(self._h, None, None, rows, cols)
        elif call == "fp8":
            def c():
                return lib.fabep_allreduce_rmsnorm_fp8(
                    self._h, None, rows, cols, ctypes.byref(p), None, None)
        else:
            def c():
                return lib.fabep_allreduce_rmsnorm(self._h, None, rows, cols,
                                                   ctypes.byref(p), None)
        refuse("AllReduce", err, c, c_name="fabep_allreduce")

    def _input(self, x):
        a = _tensor.check(x, "x", (self.dtype,), ndim=2)
        return a

    def _fast(self, x, out, out_dt=0):
        """(x's address, its shape, out, out's address) where x is a plain
        contiguous CPU torch tensor of the handle's dtype with two
        dimensions and out is None (a new one is made), x itself or a
        plain tensor of x's shape, of the handle's dtype (out_dt 0) or
        uint8 (1); else None, and the full checks decide.  A new out is
        made only once x has passed."""
        if type(x) is not _tensor._TENSOR:
            return None
        tdt = self._tdt
        if tdt is None:
            tdt = self._tdt = _tensor.torch_dtypes(self.dtype, "u8", "fp32")
        s = x.shape
        if x.dtype is not tdt[0] or len(s) != 2 or not (
                x.is_cpu and x.is_contiguous()) or x.is_neg():
            return None
        try:
            xp = x.data_ptr()
        except RuntimeError:  # no storage (sparse, mkldnn): check() refuses
            return None
        if out is None:
            out = _tensor.empty("torch", s, ("u8" if out_dt else self.dtype))
            return xp, s, out, out.data_ptr()
        if out is x and not out_dt:
            return xp, s, x, xp
        op = _tensor.plain_ptr(out, tdt[out_dt], s)
        if op is None:
            return None
        return xp, s, out, op

    def _fast_params(self, s, gamma, eps, weight_offset, scale_ub,
                     residual):
        """The norm's parameters where gamma and residual (or None) are
        plain tensors as _fast takes them and the scalars floats; else
        None (_params decides)."""
        tdt = self._tdt
        g = _tensor.plain_ptr(gamma, tdt[0], (s[1],))
        if g is None or type(eps) is not float or \
                type(weight_offset) is not float or \
                type(scale_ub) is not float:
            return None
        r = None
        if residual is not None:
            r = _tensor.plain_ptr(residual, tdt[0], s)
            if r is None:
                return None
        p = self._p
        p.gamma, p.residual = g, r
        p.eps, p.weight_offset, p.scale_ub = eps, weight_offset, scale_ub
        return p

    @serial
    def allreduce(self, x, out=None):
        """out[rows, cols] = the sum over ranks of x[rows, cols].
        Collective.  out may be x (in place) or None (a new tensor)."""
        h = self._handle()
        f = self._fast(x, out)
        if f is not None:
            xp, s, out, op = f
            self._last = s
            ret = lib.fabep_allreduce(h, xp, op, s[0], s[1])
            if ret:
                raise_for(ret, "fabep_allreduce")
            return out
        try:
            a = self._input(x)
            if out is None:
                out = _tensor.empty(a.kind, a.shape, self.dtype)
            o = _tensor.check(out, "out", (self.dtype,), a.shape,
                              written=True)
        except InvalidArgumentError as e:
            self._refuse(e, "plain", x)
        self._last = a.shape
        ret = lib.fabep_allreduce(h, a.ptr, o.ptr, a.shape[0], a.shape[1])
        if ret:
            raise_for(ret, "fabep_allreduce")
        return out

    def _params(self, a, gamma, eps, weight_offset, scale_ub, residual):
        g = _tensor.check(gamma, "gamma", (self.dtype,), (a.shape[1],))
        p = self._p
        p.gamma, p.residual = g.ptr, None
        p.eps = _real("eps", eps)
        p.weight_offset = _real("weight_offset", weight_offset)
        p.scale_ub = _real("scale_ub", scale_ub)
        if residual is not None:
            p.residual = _tensor.check(residual, "residual", (self.dtype,),
                                       a.shape, written=True).ptr
        return p

    @serial
    def allreduce_rmsnorm(self, x, gamma, eps=1e-6, weight_offset=0.0,
                          residual=None, out=None):
        """Allreduce, then RMSNorm of each row:
        h = sum (+ residual); out = (h * (gamma + weight_offset)) *
        (1 / sqrt(mean(h^2) + eps)), in fp32 in that order, rounded to
        the dtype.
        gamma: [cols]; residual: None or [rows, cols] (the same on every
        rank), overwritten with h.  out may be x or None.  Collective."""
        h = self._handle()
        f = self._fast(x, out)
        p = None if f is None else self._fast_params(
            f[1], gamma, eps, weight_offset, 1.0, residual)
        if p is not None:
            xp, s, out, op = f
            self._last = s
            ret = lib.fabep_allreduce_rmsnorm(h, xp, s[0], s[1],
                                              self._pref, op)
            if ret:
                raise_for(ret, "fabep_allreduce_rmsnorm")
            return out
        try:
            a = self._input(x)
            p = self._params(a, gamma, eps, weight_offset, 1.0, residual)
            if out is None:
                out = _tensor.empty(a.kind, a.shape, self.dtype)
            o = _tensor.check(out, "out", (self.dtype,), a.shape,
                              written=True)
        except InvalidArgumentError as e:
            self._refuse(e, "rmsnorm", x)
        self._last = a.shape
        ret = lib.fabep_allreduce_rmsnorm(h, a.ptr, a.shape[0], a.shape[1],
                                          ctypes.byref(p), o.ptr)
        if ret:
            raise_for(ret, "fabep_allreduce_rmsnorm")
        return out

    @serial
    def allreduce_rmsnorm_fp8(self, x, gamma, eps=1e-6, weight_offset=0.0,
                              scale_ub=1e4, residual=None, out=None,
                              scales=None):
        """Allreduce, RMSNorm (as allreduce_rmsnorm), then FP8 e4m3fn with
        one fp32 scale per row (max|y| / 448, clamped to scale_ub > 0).
        Returns (out uint8 [rows, cols], scales fp32 [rows]), the same on
        every rank.  Collective."""
        h = self._handle()
        f = self._fast(x, out, 1)
        p = None if f is None else self._fast_params(
            f[1], gamma, eps, weight_offset, scale_ub, residual)
        sp = None
        if p is not None:
            xp, s, out, op = f
            if scales is None:
                scales = _tensor.empty("torch", (s[0],), "fp32")
                sp = scales.data_ptr()
            else:
                sp = _tensor.plain_ptr(scales, self._tdt[2], (s[0],))
        if sp is not None:
            self._last = s
            ret = lib.fabep_allreduce_rmsnorm_fp8(h, xp, s[0], s[1],
                                                  self._pref, op, sp)
            if ret:
                raise_for(ret, "fabep_allreduce_rmsnorm_fp8")
            return out, scales
        try:
            a = self._input(x)
            p = self._params(a, gamma, eps, weight_offset, scale_ub, residual)
            if out is None:
                out = _tensor.empty(a.kind, a.shape, "u8")
            if scales is None:
                scales = _tensor.empty(a.kind, (a.shape[0],), "fp32")
            o = _tensor.check(out, "out", ("u8",), a.shape, written=True)
            s = _tensor.check(scales, "scales", ("fp32",), (a.shape[0],),
                              written=True)
        except InvalidArgumentError as e:
            self._refuse(e, "fp8", x)
        self._last = a.shape
        ret = lib.fabep_allreduce_rmsnorm_fp8(h, a.ptr, a.shape[0], a.shape[1],
                                              ctypes.byref(p), o.ptr, s.ptr)
        if ret:
            raise_for(ret, "fabep_allreduce_rmsnorm_fp8")
        return out, scales
