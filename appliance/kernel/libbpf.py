"""ctypes bindings on libbpf.so.1 (libbpf 1.x): the object, map and program calls the kernel layer
needs, libbpf's log (the verifier's included) routed into `logging`, and failures raised as
`BpfError` carrying the errno text and the last log lines, so a refused program says why.

libbpf 1.x returns -errno from int calls and NULL (errno set) from pointer calls.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import errno as errno_mod
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("appliance.kernel.libbpf")

LIBBPF_WARN, LIBBPF_INFO, LIBBPF_DEBUG = 0, 1, 2
_LEVELS = {LIBBPF_WARN: logging.WARNING, LIBBPF_INFO: logging.INFO, LIBBPF_DEBUG: logging.DEBUG}


class BpfError(OSError):
    """A libbpf or bpf() failure: errno, what was attempted, and the log lines libbpf printed."""

    def __init__(self, err: int, what: str, log_lines: list[str] | None = None) -> None:
        self.log_lines = log_lines or []
        reason = f"{what}: {os.strerror(err)} (errno {errno_mod.errorcode.get(err, err)})"
        if self.log_lines:
            reason += "\n" + "\n".join(self.log_lines)
        super().__init__(err, reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class bpf_object_open_opts(ctypes.Structure):
    """libbpf 1.1's layout, `sz` first; libbpf accepts any prefix of later versions' struct."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("object_name", ctypes.c_char_p),
        ("relaxed_maps", ctypes.c_bool),
        ("pin_root_path", ctypes.c_char_p),
        ("_attach_prog_fd", ctypes.c_uint32),
        ("kconfig", ctypes.c_char_p),
        ("btf_custom_path", ctypes.c_char_p),
        ("kernel_log_buf", ctypes.c_char_p),
        ("kernel_log_size", ctypes.c_size_t),
        ("kernel_log_level", ctypes.c_uint32),
    ]


class bpf_map_batch_opts(ctypes.Structure):
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("elem_flags", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


_PrintFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class _Lib:
    """The loaded libraries and libbpf's print hook. libbpf's print function is process-wide, so
    this is one object per process; it keeps the callback alive and the recent lines for errors."""

    def __init__(self) -> None:
        self.bpf = ctypes.CDLL("libbpf.so.1", use_errno=True)
        self.libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._declare()
        self.recent: collections.deque[tuple[int, str]] = collections.deque(maxlen=30)
        self.holding = False
        self._partial = ""
        self._lock = threading.Lock()
        self._callback = _PrintFn(self._print)  # referenced here so it is never collected
        self.bpf.libbpf_set_print(self._callback)

    def _declare(self) -> None:
        b, vp, ci, cs = self.bpf, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
        signatures: dict[str, tuple[object, list[object]]] = {
            "libbpf_set_print": (vp, [_PrintFn]),
            "bpf_object__open_file": (vp, [cs, ctypes.POINTER(bpf_object_open_opts)]),
            "bpf_object__load": (ci, [vp]),
            "bpf_object__close": (None, [vp]),
            "bpf_object__find_map_by_name": (vp, [vp, cs]),
            "bpf_object__find_program_by_name": (vp, [vp, cs]),
            "bpf_map__fd": (ci, [vp]),
            "bpf_map__set_pin_path": (ci, [vp, cs]),
            "bpf_map__pin_path": (cs, [vp]),
            "bpf_program__fd": (ci, [vp]),
            "bpf_map_lookup_elem": (ci, [ci, vp, vp]),
            "bpf_map_update_elem": (ci, [ci, vp, vp, ctypes.c_uint64]),
            "bpf_map_delete_elem": (ci, [ci, vp]),
            "bpf_map_get_next_key": (ci, [ci, vp, vp]),
            "bpf_map_lookup_batch": (
                ci,
                [ci, vp, vp, vp, vp, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(bpf_map_batch_opts)],
            ),
            "bpf_prog_get_fd_by_id": (ci, [ctypes.c_uint32]),
            "bpf_obj_get_info_by_fd": (ci, [ci, vp, ctypes.POINTER(ctypes.c_uint32)]),
            "libbpf_num_possible_cpus": (ci, []),
            "libbpf_strerror": (ci, [ci, cs, ctypes.c_size_t]),
        }
        for name, (restype, argtypes) in signatures.items():
            fn = getattr(b, name)
            fn.restype, fn.argtypes = restype, argtypes
        self.libc.vsnprintf.restype = ci
        self.libc.vsnprintf.argtypes = [cs, ctypes.c_size_t, cs, vp]

    def _print(self, level: int, fmt: bytes | None, args: int | None) -> int:
        # The va_list arrives as a pointer (x86-64: an array that decays; aarch64: a composite
        # passed by reference) and goes on to vsnprintf the same way.
        try:
            if fmt is None:
                return 0
            size = 4096
            buf = ctypes.create_string_buffer(size)
            n = self.libc.vsnprintf(buf, size, fmt, args)
            text = buf.value.decode("utf-8", "replace")
            if n >= size:
                text += "..."
            self._emit(level, text)
        except Exception:  # a callback must never raise into C
            log.exception("libbpf print callback failed")
        return 0

    def _emit(self, level: int, text: str) -> None:
        with self._lock:
            text = self._partial + text
            lines = text.split("\n")
            self._partial = lines.pop()
            for line in lines:
                if not line.strip():
                    continue
                if level <= LIBBPF_INFO:  # errors quote warnings and the verifier's log, not debug chatter
                    self.recent.append((level, line))
                shown = logging.DEBUG if self.holding else _LEVELS.get(level, logging.DEBUG)
                log.log(shown, "%s", line)

    def take_recent(self) -> list[str]:
        with self._lock:
            lines = [line for _, line in self.recent]
            self.recent.clear()
            return lines

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """libbpf's warnings during the block are held back: a failure raised from it quotes them
        (see `check`), so they are not logged twice; on success they are logged as usual."""
        with self._lock:
            self.recent.clear()
            self.holding = True
        try:
            yield
        finally:
            with self._lock:
                self.holding = False
                held = list(self.recent)
                self.recent.clear()
            for level, line in held:
                log.log(_LEVELS.get(level, logging.DEBUG), "%s", line)


_lib: _Lib | None = None
_lib_lock = threading.Lock()


def lib() -> _Lib:
    """libbpf, loaded once (raises OSError where libbpf.so.1 is absent)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _Lib()
        return _lib


def check(ret: int, what: str) -> int:
    """Raise BpfError for a negative libbpf return (-errno); return it otherwise."""
    if ret < 0:
        raise BpfError(-ret, what, lib().take_recent())
    return ret


class bpf_prog_info_head(ctypes.Structure):
    """The start of struct bpf_prog_info (UAPI, only ever appended to): up to the name. The
    kernel fills as much as the caller's length says."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", ctypes.c_uint32),
        ("xlated_prog_len", ctypes.c_uint32),
        ("jited_prog_insns", ctypes.c_uint64),
        ("xlated_prog_insns", ctypes.c_uint64),
        ("load_time", ctypes.c_uint64),
        ("created_by_uid", ctypes.c_uint32),
        ("nr_map_ids", ctypes.c_uint32),
        ("map_ids", ctypes.c_uint64),
        ("name", ctypes.c_char * 16),
    ]


def program_name(prog_id: int) -> str:
    """The name of the loaded BPF program with this id."""
    bpf = lib().bpf
    fd = check(bpf.bpf_prog_get_fd_by_id(prog_id), f"bpf_prog_get_fd_by_id({prog_id})")
    try:
        info = bpf_prog_info_head()
        size = ctypes.c_uint32(ctypes.sizeof(info))
        check(bpf.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)), f"prog {prog_id} info")
        return info.name.decode(errors="replace")
    finally:
        os.close(fd)


def num_possible_cpus() -> int:
    return check(lib().bpf.libbpf_num_possible_cpus(), "libbpf_num_possible_cpus")


class BpfObject:
    """An opened (and after `load()`, loaded) BPF object file. Maps with `pinning` are pinned by
    name under `pin_root`, and reused from there when already pinned."""

    def __init__(self, path: Path, pin_root: Path | None = None) -> None:
        self.path = path
        self._lib = lib()
        opts = bpf_object_open_opts()
        opts.sz = ctypes.sizeof(opts)
        self._pin_root = str(pin_root).encode() if pin_root else None  # kept alive while open
        opts.pin_root_path = self._pin_root
        with self._lib.hold():
            ptr = self._lib.bpf.bpf_object__open_file(str(path).encode(), ctypes.byref(opts))
            if not ptr:
                raise BpfError(ctypes.get_errno(), f"bpf_object__open_file({path})", self._lib.take_recent())
        self._obj: int | None = ptr
        self.loaded = False

    @property
    def handle(self) -> int:
        if self._obj is None:
            raise ValueError(f"BPF object {self.path} is closed")
        return self._obj

    def load(self) -> None:
        with self._lib.hold():
            check(self._lib.bpf.bpf_object__load(self.handle), f"bpf_object__load({self.path.name})")
        self.loaded = True

    def map_fd(self, name: str) -> int:
        m = self._lib.bpf.bpf_object__find_map_by_name(self.handle, name.encode())
        if not m:
            raise BpfError(errno_mod.ENOENT, f"map {name!r} in {self.path.name}")
        return check(self._lib.bpf.bpf_map__fd(m), f"bpf_map__fd({name})")

    def map_pin_path(self, name: str) -> str | None:
        m = self._lib.bpf.bpf_object__find_map_by_name(self.handle, name.encode())
        if not m:
            raise BpfError(errno_mod.ENOENT, f"map {name!r} in {self.path.name}")
        path: bytes | None = self._lib.bpf.bpf_map__pin_path(m)
        return path.decode() if path else None

    def program_fd(self, name: str) -> int:
        p = self._lib.bpf.bpf_object__find_program_by_name(self.handle, name.encode())
        if not p:
            raise BpfError(errno_mod.ENOENT, f"program {name!r} in {self.path.name}")
        return check(self._lib.bpf.bpf_program__fd(p), f"bpf_program__fd({name})")

    def close(self) -> None:
        """Closes the object and its fds; pinned maps and attached programs stay in the kernel."""
        if self._obj is not None:
            self._lib.bpf.bpf_object__close(self._obj)
            self._obj = None

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
