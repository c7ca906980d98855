"""Typed access to the kernel layer's maps: the C structs of bpf/zerolayer.bpf.c as ctypes
structures, and a `BpfMap` that looks up, updates, deletes, iterates and batch-reads them
through libbpf's bpf() wrappers."""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import socket
from collections.abc import Iterator
from typing import Generic, TypeVar, cast

from appliance.kernel.libbpf import BpfError, bpf_map_batch_opts, lib, num_possible_cpus

FLOW_DIGESTS = 10
DIGEST_SIZE = 32
BPF_ANY, BPF_NOEXIST, BPF_EXIST = 0, 1, 2
AF_INET, AF_INET6 = int(socket.AF_INET), int(socket.AF_INET6)
PROTOS = {"tcp": int(socket.IPPROTO_TCP), "udp": int(socket.IPPROTO_UDP)}
PROTO_NAMES = {v: k for k, v in PROTOS.items()}
# verdicts map indexes, as in the C enum verdict_index
VERDICTS = ("tc_pass", "tc_drop", "xdp_pass", "xdp_drop")


class FlowKey(ctypes.Structure):
    """struct flow_key: the client's view; ports in host order, IPv4 in the first 4 bytes."""

    _fields_ = [
        ("family", ctypes.c_uint8),
        ("proto", ctypes.c_uint8),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("pad", ctypes.c_uint8 * 2),
        ("saddr", ctypes.c_uint8 * 16),
        ("daddr", ctypes.c_uint8 * 16),
    ]

    @classmethod
    def make(cls, proto: str, client: tuple[str, int], server: tuple[str, int]) -> FlowKey:
        # A dual-stack socket names IPv4 peers as ::ffff:a.b.c.d; the kernel sees IPv4 packets.
        c, s = _unmap(ipaddress.ip_address(client[0])), _unmap(ipaddress.ip_address(server[0]))
        if c.version != s.version:
            raise ValueError(f"client {c} and server {s} are of different address families")
        key = cls()
        key.family = AF_INET if c.version == 4 else AF_INET6
        key.proto = PROTOS[proto]
        key.sport, key.dport = client[1], server[1]
        ctypes.memmove(key.saddr, c.packed, len(c.packed))
        ctypes.memmove(key.daddr, s.packed, len(s.packed))
        return key

    def _addr(self, raw: ctypes.Array[ctypes.c_uint8]) -> str:
        data = bytes(raw)
        return str(ipaddress.ip_address(data[:4] if self.family == AF_INET else data))

    @property
    def client(self) -> tuple[str, int]:
        return self._addr(self.saddr), int(self.sport)

    @property
    def server(self) -> tuple[str, int]:
        return self._addr(self.daddr), int(self.dport)

    @property
    def proto_name(self) -> str:
        return PROTO_NAMES.get(self.proto, str(self.proto))

    def __str__(self) -> str:
        host, port = self.client
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class FlowValue(ctypes.Structure):
    """struct flow_value: counters kept by the kernel, digests written by userspace."""

    _fields_ = [
        ("last_ns", ctypes.c_uint64),
        ("packets", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("digests", (ctypes.c_uint8 * DIGEST_SIZE) * FLOW_DIGESTS),
    ]

    def digest_list(self) -> list[bytes]:
        """The stored digests, all-zero slots (never written) left out."""
        out = [bytes(d) for d in self.digests]
        return [d for d in out if any(d)]

    def set_digests(self, digests: list[bytes]) -> None:
        """Stores the last FLOW_DIGESTS digests, each exactly DIGEST_SIZE bytes; unused slots zero."""
        last = digests[-FLOW_DIGESTS:]
        for d in last:
            if len(d) != DIGEST_SIZE:
                raise ValueError(f"a digest is {DIGEST_SIZE} bytes, got {len(d)}")
        ctypes.memset(self.digests, 0, ctypes.sizeof(self.digests))
        for i, d in enumerate(last):
            ctypes.memmove(self.digests[i], d, DIGEST_SIZE)


class LpmKey(ctypes.Structure):
    """struct lpm_key: IPv6 prefixes; IPv4 a.b.c.d/n as ::ffff:a.b.c.d/(96 + n)."""

    _fields_ = [
        ("prefixlen", ctypes.c_uint32),
        ("addr", ctypes.c_uint8 * 16),
    ]

    @classmethod
    def from_cidr(cls, cidr: str) -> LpmKey:
        net = ipaddress.ip_network(cidr, strict=False)
        key = cls()
        if net.version == 4:
            mapped = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + net.network_address.packed)
            key.prefixlen, packed = 96 + net.prefixlen, mapped.packed
        else:
            key.prefixlen, packed = net.prefixlen, net.network_address.packed
        ctypes.memmove(key.addr, packed, 16)
        return key

    @classmethod
    def host(cls, addr: str) -> LpmKey:
        ip = _unmap(ipaddress.ip_address(addr))
        return cls.from_cidr(f"{ip}/{ip.max_prefixlen}")

    def cidr(self) -> str:
        ip = ipaddress.IPv6Address(bytes(self.addr))
        if ip.ipv4_mapped is not None and self.prefixlen >= 96:
            return f"{ip.ipv4_mapped}/{self.prefixlen - 96}"
        return f"{ip}/{self.prefixlen}"


def _unmap(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


K = TypeVar("K", bound=ctypes.Structure | ctypes._SimpleCData)
V = TypeVar("V", bound=ctypes.Structure | ctypes._SimpleCData)


class BpfMap(Generic[K, V]):
    """One map by fd, keys and values as ctypes types. The fd belongs to the caller (the loaded
    object); this class never closes it."""

    def __init__(self, fd: int, key_type: type[K], value_type: type[V], name: str = "map") -> None:
        self.fd, self.key_type, self.value_type, self.name = fd, key_type, value_type, name
        self._bpf = lib().bpf

    def _fail(self, ret: int, op: str) -> BpfError:
        return BpfError(-ret, f"{op} on map {self.name!r}")

    def lookup(self, key: K) -> V | None:
        value = self.value_type()
        ret = self._bpf.bpf_map_lookup_elem(self.fd, ctypes.byref(key), ctypes.byref(value))
        if ret == -errno.ENOENT:
            return None
        if ret < 0:
            raise self._fail(ret, "lookup")
        return value

    def update(self, key: K, value: V, flags: int = BPF_ANY) -> None:
        ret = self._bpf.bpf_map_update_elem(self.fd, ctypes.byref(key), ctypes.byref(value), flags)
        if ret < 0:
            raise self._fail(ret, "update")

    def delete(self, key: K) -> bool:
        """True when the key was there."""
        ret = self._bpf.bpf_map_delete_elem(self.fd, ctypes.byref(key))
        if ret == -errno.ENOENT:
            return False
        if ret < 0:
            raise self._fail(ret, "delete")
        return True

    def iter_keys(self) -> Iterator[K]:
        """Keys by bpf_map_get_next_key. Under concurrent deletion the walk may restart from the
        first key (the kernel's behaviour for hash maps); callers wanting a snapshot use items()."""
        prev: K | None = None
        while True:
            nxt = self.key_type()
            ret = self._bpf.bpf_map_get_next_key(self.fd, ctypes.byref(prev) if prev is not None else None,
                                                 ctypes.byref(nxt))  # fmt: skip
            if ret == -errno.ENOENT:
                return
            if ret < 0:
                raise self._fail(ret, "get_next_key")
            yield nxt
            prev = nxt

    def iterate(self) -> Iterator[tuple[K, V]]:
        """(key, value) pairs, one lookup per key; entries gone meanwhile are skipped."""
        for key in self.iter_keys():
            value = self.lookup(key)
            if value is not None:
                yield key, value

    def lookup_batch(self, chunk: int = 256) -> list[tuple[K, V]]:
        """All entries via bpf_map_lookup_batch; raises BpfError(EINVAL/ENOTSUPP) where the map
        type has no batch ops."""
        key_size, value_size = ctypes.sizeof(self.key_type), ctypes.sizeof(self.value_type)
        keys = (ctypes.c_uint8 * (key_size * chunk))()
        values = (ctypes.c_uint8 * (value_size * chunk))()
        token_size = max(key_size, 8)
        in_batch, out_batch = (ctypes.c_uint8 * token_size)(), (ctypes.c_uint8 * token_size)()
        opts = bpf_map_batch_opts(sz=ctypes.sizeof(bpf_map_batch_opts))
        out: list[tuple[K, V]] = []
        first = True
        while True:
            count = ctypes.c_uint32(chunk)
            ret = self._bpf.bpf_map_lookup_batch(self.fd, None if first else in_batch, out_batch, keys, values,
                                                 ctypes.byref(count), ctypes.byref(opts))  # fmt: skip
            if ret < 0 and ret != -errno.ENOENT:
                raise self._fail(ret, "lookup_batch")
            for i in range(count.value):
                key = cast(K, self.key_type.from_buffer_copy(keys, i * key_size))
                value = cast(V, self.value_type.from_buffer_copy(values, i * value_size))
                out.append((key, value))
            if ret == -errno.ENOENT:  # the last batch
                return out
            ctypes.memmove(in_batch, out_batch, token_size)
            first = False

    def items(self) -> list[tuple[K, V]]:
        """All entries: batched where the kernel has it, else one by one."""
        try:
            return self.lookup_batch()
        except BpfError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, 524):  # 524: the kernel's ENOTSUPP
                raise
            return list(self.iterate())


class PerCpuCounters:
    """A PERCPU_ARRAY of u64 counters, read as the sum over possible CPUs."""

    def __init__(self, fd: int, entries: int, name: str = "percpu") -> None:
        self.fd, self.entries, self.name = fd, entries, name
        self.ncpus = num_possible_cpus()
        self._bpf = lib().bpf

    def read(self, index: int) -> int:
        key = ctypes.c_uint32(index)
        values = (ctypes.c_uint64 * self.ncpus)()  # u64 per CPU, already 8-byte aligned
        ret = self._bpf.bpf_map_lookup_elem(self.fd, ctypes.byref(key), values)
        if ret < 0:
            raise BpfError(-ret, f"lookup of {index} on map {self.name!r}")
        return sum(values)

    def read_all(self) -> list[int]:
        return [self.read(i) for i in range(self.entries)]
