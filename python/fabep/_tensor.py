# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""Tensors in and out without copies: torch CPU tensors and numpy arrays.

An input is described by its address, its shape and its row stride; it
is never copied.  Element types by name:

    "fp32"  torch.float32            numpy float32
    "bf16"  torch.bfloat16           numpy uint16 (the bf16 bit patterns)
    "u8"    torch.uint8              numpy uint8  (FP8 e4m3fn codes)
    "i32"   torch.int32              numpy int32

Library-owned memory comes out as numpy arrays or torch tensors that
view it (torch bf16 through an int16 view, since torch 1.13 has no
uint16); each keeps the object that owns the memory alive.
"""
import ctypes
import sys

import numpy as np

from .errors import invalid

_NP = {"fp32": np.dtype(np.float32), "bf16": np.dtype(np.uint16),
       "u8": np.dtype(np.uint8), "i32": np.dtype(np.int32),
       "u32": np.dtype(np.uint32)}
_NP_NAME = {v: k for k, v in _NP.items()}
# the numpy type a torch view of library memory is made through, where
# torch has no type of those bits (bf16 reinterpreted after, u32 as i32)
_BITS = {"bf16": np.dtype(np.int16), "u32": np.dtype(np.int32)}
_TORCH = {}
_TORCH_NAME = {}


ITEMSIZE = {"fp32": 4, "bf16": 2, "u8": 1, "i32": 4, "u32": 4}
_TENSOR = None   # torch.Tensor, once torch is loaded
_STRIDED = None  # torch.strided, the layout of dense tensors


def _torch():
    """torch, imported on first use: a numpy-only program never pays for
    importing it, and a torch tensor means torch is already loaded."""
    global _TENSOR, _STRIDED
    t = sys.modules.get("torch")
    if t is None:
        import torch as t
    if _TENSOR is None:
        _TORCH.update({"fp32": t.float32, "bf16": t.bfloat16, "u8": t.uint8,
                       "i32": t.int32})
        _TORCH_NAME.update({v: k for k, v in _TORCH.items()})
        _STRIDED = t.strided
        _TENSOR = t.Tensor
    return t


def kind_of(a):
    """'torch' or 'numpy' for a supported input, else None."""
    if _TENSOR is not None:
        if isinstance(a, _TENSOR):
            return "torch"
    elif "torch" in sys.modules:
        _torch()
        return kind_of(a)
    if isinstance(a, np.ndarray):
        return "numpy"
    return None


class Arg:
    """An input checked for type, device, dtype, shape and layout."""
    __slots__ = ("ptr", "shape", "ld", "kind", "dtype")


def _bad(msg):
    return invalid(msg)


def _shape_ok(shp, shape, ndim):
    """shp matches shape (None: any size there), or has ndim dimensions."""
    if shape is None:
        return ndim is None or len(shp) == ndim
    if len(shp) != len(shape):
        return False
    for g, w in zip(shp, shape):
        if w is not None and g != w:
            return False
    return True


def check(a, name, dtypes, shape=None, ndim=None, rows_strided=False,
          written=False):
    """Check input `a` and return an Arg.

    dtypes: the names it may have; shape: the expected shape, None in a
    position accepting any size; rows_strided: a 2-D input may have rows
    farther apart than their length (Arg.ld, in elements), its values
    within a row must be contiguous; written: the library writes it (a
    read-only numpy array is refused).  Raises InvalidArgumentError.
    """
    if _TENSOR is not None and isinstance(a, _TENSOR):
        # the common case on every call's path, in few attribute reads:
        # a CPU tensor of an expected dtype and shape, contiguous
        if not a.is_cpu:
            raise _bad("%s: tensor on device %s; fabep works on CPU tensors"
                       % (name, a.device))
        if a.layout is not _STRIDED:
            raise _bad("%s: a %s tensor; fabep takes dense (strided) "
                       "tensors" % (name, a.layout))
        if a.is_neg() or a.is_conj():
            raise _bad("%s: a view with torch's negative or conjugate bit "
                       "set, whose memory holds other values; pass "
                       "resolve_neg() / resolve_conj() of it" % name)
        dt = _TORCH_NAME.get(a.dtype)
        shp = a.shape
        if dt in dtypes and a.is_contiguous() and (
                shp == shape if shape is not None and None not in shape
                else _shape_ok(shp, shape, ndim)):
            r = Arg()
            r.ptr, r.shape, r.ld, r.kind, r.dtype = \
                a.data_ptr(), shp, shp[-1] if shp else 1, "torch", dt
            return r
        kind = "torch"
        contiguous = a.is_contiguous()
        ptr = a.data_ptr()
    else:
        kind = kind_of(a)
        if kind == "torch":
            return check(a, name, dtypes, shape, ndim, rows_strided, written)
        if kind is None:
            raise _bad("%s: expected a torch tensor or a numpy array, got %s"
                       % (name, type(a).__name__))
        dt = _NP_NAME.get(a.dtype)
        contiguous = a.flags.c_contiguous
        ptr = a.__array_interface__["data"][0]
        if not a.flags.writeable and written:
            raise _bad("%s: read-only array" % name)
    if dt not in dtypes:
        raise _bad("%s: dtype %s, expected %s" % (
            name, a.dtype, " or ".join(_want(d, kind) for d in dtypes)))
    shp = a.shape  # torch.Size is a tuple
    if shape is not None:
        if not _shape_ok(shp, shape, None):
            raise _bad("%s: shape %s, expected %s" % (name, tuple(shp),
                                                      _fmt(shape)))
    elif ndim is not None and len(shp) != ndim:
        raise _bad("%s: %d dimensions %s, expected %d" % (
            name, len(shp), tuple(shp), ndim))
    ld = shp[-1] if shp else 1
    if not contiguous:
        if kind == "torch":
            strides = a.stride()
        else:
            strides = tuple(s // a.itemsize if s % a.itemsize == 0 else -1
                            for s in a.strides)
        ok = (rows_strided and len(shp) == 2 and
              (shp[1] <= 1 or strides[1] == 1) and
              (shp[0] <= 1 or strides[0] >= shp[1]))
        if not ok:
            raise _bad("%s: not contiguous (strides %s elements)%s" % (
                name, tuple(strides), "; rows may be apart but each row "
                "contiguous" if rows_strided else ""))
        ld = strides[0] if shp[0] > 1 else shp[1]
    r = Arg()
    r.ptr, r.shape, r.ld, r.kind, r.dtype = ptr, shp, ld, kind, dt
    return r


def torch_dtypes(*names):
    """The torch dtypes of names ("bf16", "fp32", "u8", ...) as a tuple,
    for the fast paths to compare with by identity; only once torch is
    loaded (_TENSOR set), which a torch tensor passed in implies."""
    return tuple(_TORCH[n] for n in names)


def plain_ptr(a, tdt, shape):
    """a.data_ptr() where `a` is what most calls pass: a contiguous CPU
    torch tensor (not a subclass) of torch dtype tdt and of `shape`,
    checked in one read each.  Else None, and check(), which takes every
    case and names what is wrong, decides.  The caller has loaded torch
    (tdt is a torch dtype)."""
    if type(a) is _TENSOR and a.dtype is tdt and a.shape == shape and \
            a.is_cpu and a.is_contiguous() and not a.is_neg():
        try:
            return a.data_ptr()
        except RuntimeError:  # no storage (sparse, mkldnn): check() refuses
            pass
    return None


def _want(dt, kind):
    if kind == "torch":
        _torch()
        return str(_TORCH.get(dt, dt))
    return "numpy.%s%s" % (_NP[dt].name,
                           " (bf16 bits)" if dt == "bf16" else "")


def _fmt(shape):
    if shape is None:
        return ""
    return "(%s)" % ", ".join("*" if s is None else str(s) for s in shape)


def empty(kind, shape, dt):
    """A new caller-owned output of `kind`, shape and dtype name."""
    if kind == "torch":
        torch = _torch()
        return torch.empty(shape, dtype=_TORCH[dt])
    return np.empty(shape, dtype=_NP[dt])


def view(kind, addr, shape, dt, owner, row_stride=None):
    """A view of library memory at `addr` without a copy.

    row_stride (bytes) gives 2-D rows farther apart than their length.
    `owner` is kept alive by the view: the numpy array's base is a ctypes
    array over the memory that holds it (and torch keeps the numpy
    array).
    """
    torch_bits = kind == "torch" and dt in _BITS
    npdt = _BITS[dt] if torch_bits else _NP[dt]
    if not addr or 0 in shape:
        a = np.zeros(shape, dtype=npdt)
    else:
        isz = npdt.itemsize
        strides = None
        if row_stride is not None and len(shape) == 2:
            strides = (row_stride, isz)
            nbytes = (shape[0] - 1) * row_stride + shape[1] * isz
        else:
            nbytes = isz
            for d in shape:
                nbytes *= d
        buf = (ctypes.c_char * nbytes).from_address(addr)
        buf.owner = owner
        a = np.ndarray(shape, npdt, buf, 0, strides)
    if kind != "torch":
        return a
    torch = _torch()
    if dt == "bf16":
        return torch.from_numpy(a).view(torch.bfloat16)
    return torch.from_numpy(a)
