"""Copying a span of positions of one KV row out of a slot buffer, or into one, without touching
the rest of the buffer.

A layer's buffer is [rows, kv_heads, capacity, head_size]: `tokens` positions of a row from
position `start` are kv_heads runs of tokens * head_size elements, capacity * head_size apart. On
a GPU that is one cudaMemcpy2D per direction (ONNX Runtime's Python API can only copy a whole
buffer, which for the prefix pool meant every slot's full capacity, twice, per request). The
strided layout is computed once here and used by both the GPU copy and the host copy that tests it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# cudaMemcpyKind: the direction from the pointers themselves (unified addressing), so a buffer on
# any GPU is copied right whichever device is current on the calling thread.
CUDA_MEMCPY_DEFAULT = 4

# dst, dst pitch, src, src pitch, width (bytes), height (runs)
Copy2D = Callable[[int, int, int, int, int, int], None]


@dataclass(frozen=True)
class RowSpan:
    """Where `tokens` positions of a row lie in a layer buffer: `runs` runs of `width` bytes, one
    per KV head, `pitch` bytes apart, starting `offset` bytes into the buffer."""

    offset: int
    pitch: int
    width: int
    runs: int


def row_span(shape: list[int] | tuple[int, ...], itemsize: int, row: int, tokens: int, start: int = 0) -> RowSpan:
    rows, heads, capacity, head = shape
    if not 0 <= row < rows or start < 0 or tokens < 0 or start + tokens > capacity:
        raise IndexError(f"row {row}, positions {start}..{start + tokens}: outside a [{rows}, {heads}, {capacity}, "
                         f"{head}] buffer")  # fmt: skip
    pitch = capacity * head * itemsize
    return RowSpan(offset=row * heads * pitch + start * head * itemsize, pitch=pitch, width=tokens * head * itemsize,
                   runs=heads)  # fmt: skip


def read_row(buffer: int, shape: list[int], dtype: np.dtype, row: int, tokens: int, copy: Copy2D,
             start: int = 0) -> np.ndarray:  # fmt: skip
    """`tokens` positions of the row from `start`, as a host array [kv_heads, tokens, head_size]."""
    span = row_span(shape, dtype.itemsize, row, tokens, start)
    out = np.empty((shape[1], tokens, shape[3]), dtype=dtype)
    if span.width:
        copy(out.ctypes.data, span.width, buffer + span.offset, span.pitch, span.width, span.runs)
    return out


def write_row(buffer: int, shape: list[int], row: int, values: np.ndarray, copy: Copy2D, start: int = 0) -> None:
    """Put a host array [kv_heads, tokens, head_size] into the row from position `start`."""
    values = np.ascontiguousarray(values)
    span = row_span(shape, values.dtype.itemsize, row, values.shape[1], start)
    if span.width:
        copy(buffer + span.offset, span.pitch, values.ctypes.data, span.width, span.width, span.runs)


def host_copy(dst: int, dpitch: int, src: int, spitch: int, width: int, height: int) -> None:
    """cudaMemcpy2D's contract on host memory."""
    for i in range(height):
        ctypes.memmove(dst + i * dpitch, src + i * spitch, width)


class CudaCopy:
    """cudaMemcpy2D from the CUDA runtime ONNX Runtime's CUDA provider has loaded."""

    NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")

    def __init__(self) -> None:
        self.memcpy2d = self._runtime().cudaMemcpy2D
        self.memcpy2d.restype = ctypes.c_int
        self.memcpy2d.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                  ctypes.c_size_t, ctypes.c_int]  # fmt: skip

    @classmethod
    def _runtime(cls) -> ctypes.CDLL:
        errors = []
        for name in cls.NAMES:
            try:
                return ctypes.CDLL(name)
            except OSError as exc:
                errors.append(str(exc))
        raise RuntimeError(f"the CUDA runtime library is not loadable: {'; '.join(errors)}")

    def __call__(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int) -> None:
        status = self.memcpy2d(dst, dpitch, src, spitch, width, height, CUDA_MEMCPY_DEFAULT)
        if status != 0:
            raise RuntimeError(f"cudaMemcpy2D failed with CUDA error {status}")
