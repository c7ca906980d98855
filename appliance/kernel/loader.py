"""The kernel layer: loads bpf/zerolayer.bpf.o with its maps pinned in a directory on bpffs,
fills the service ports and the client allowlist, attaches the tc programs (and XDP where asked)
with pyroute2, and detaches exactly what it attached.

`UserspaceFlows` is the same interface without the kernel: the same key/value records in an LRU
bounded dict, the allowlist checked by the transports through `allowed()`. `open_kernel_layer`
picks one by the configured mode.
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import os
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from appliance.kernel.libbpf import BpfError, BpfObject, program_name
from appliance.kernel.maps import (
    VERDICTS,
    BpfMap,
    FlowKey,
    FlowValue,
    LpmKey,
    PerCpuCounters,
)

log = logging.getLogger("appliance.kernel")

BPFFS = Path("/sys/fs/bpf")
PIN_ROOT = BPFFS / "zerolayer"
BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"
# An installed wheel carries the object beside this module (the wheel build compiles it); a
# checkout uses what `make -C bpf` built.
PACKAGED_OBJECT = Path(__file__).resolve().parent / "zerolayer.bpf.o"
OBJECT_PATH = PACKAGED_OBJECT if PACKAGED_OBJECT.exists() else BPF_DIR / "build" / "zerolayer.bpf.o"
TC_INGRESS, TC_EGRESS = "ffff:fff2", "ffff:fff3"
FILTER_NAME = "zerolayer"
XDP_FLAGS_UPDATE_IF_NOEXIST, XDP_FLAGS_SKB_MODE, XDP_FLAGS_DRV_MODE = 1, 2, 4
XDP_MODES = {"generic": XDP_FLAGS_SKB_MODE, "native": XDP_FLAGS_DRV_MODE}
MAX_FLOWS = 65536
ENFORCE_ALLOW_ALL, ENFORCE_ALLOWLIST = 0, 1
ETH_HEADER, IPV4_HEADER, IPV6_HEADER, UDP_HEADER = 14, 20, 40, 8  # skb->len at tc holds the whole frame

Mode = Literal["required", "auto", "off"]
XdpMode = Literal["off", "generic", "native"]


class KernelLayerError(RuntimeError):
    """The kernel layer could not be set up; `reason` is the kernel's (errno text, libbpf and
    verifier log lines)."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"kernel layer: {what}: {reason}")
        self.what, self.reason = what, reason


Digest = bytes  # 32 bytes: a prompt block's chain hash


@dataclass(frozen=True)
class FlowRecord:
    proto: str  # "udp" or "tcp"
    client: tuple[str, int]
    server: tuple[str, int]
    last_ns: int  # CLOCK_MONOTONIC ns of the last packet (bpf_ktime_get_ns)
    packets: int
    bytes: int  # skb->len at tc: the frame with its L2 header
    digests: tuple[Digest, ...] = field(default=())

    @classmethod
    def of(cls, key: FlowKey, value: FlowValue) -> FlowRecord:
        return cls(key.proto_name, key.client, key.server, int(value.last_ns), int(value.packets),
                   int(value.bytes), tuple(value.digest_list()))  # fmt: skip


class FlowLayer(Protocol):
    """What the daemon uses, kernel or userspace."""

    def set_ports(self, ports: Iterable[int]) -> None: ...

    def set_allowlist(self, cidrs: Sequence[str]) -> None: ...

    def allowed(self, addr: str) -> bool: ...

    def flows(self) -> Iterator[FlowRecord]: ...

    def lookup_flow(self, key: FlowKey) -> FlowRecord | None: ...

    def write_digests(self, key: FlowKey, digests: list[bytes]) -> None: ...

    def verdict_counts(self) -> dict[str, int]: ...

    def close(self) -> None: ...


def _parse_allowlist(cidrs: Sequence[str]) -> list[LpmKey]:
    keys = []
    for cidr in cidrs:
        try:
            keys.append(LpmKey.from_cidr(cidr))
        except ValueError as e:
            raise ValueError(f"allowlist entry {cidr!r} is not an IPv4/IPv6 address or CIDR: {e}") from e
    return keys


def _log_allow_all() -> None:
    log.info("client allowlist is empty: every client is allowed")


def is_bpffs_mounted(path: Path = BPFFS) -> bool:
    with open("/proc/self/mounts") as f:
        return any(len(p) > 2 and p[1] == str(path) and p[2] == "bpf" for p in (line.split() for line in f))


BPF_FS_MAGIC = 0xCAFE4A11


def on_bpffs(path: Path) -> bool:
    """Whether `path` exists on a bpffs (its root, a directory in it, or a bind mount of one)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first field, a long
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(str(path).encode(), buf) != 0:
        return False
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF == BPF_FS_MAGIC


def pin_dir(configured: str, runtime_directory: str | None) -> Path:
    """Where the maps are pinned: the configured directory; else the one the systemd unit binds
    into its runtime directory ($RUNTIME_DIRECTORY/bpf, so that the daemon never needs to reach
    through the root-only /sys/fs/bpf), when that is on bpffs; else /sys/fs/bpf/zerolayer."""
    if configured:
        return Path(configured)
    if runtime_directory:
        bound = Path(runtime_directory.split(":")[0]) / "bpf"
        if on_bpffs(bound):
            return bound
    return PIN_ROOT


def ensure_bpffs(path: Path = BPFFS) -> None:
    """Mounts bpffs at `path` when nothing is mounted there."""
    if is_bpffs_mounted(path):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(b"bpf", str(path).encode(), b"bpf", 0, None) != 0:
        err = ctypes.get_errno()
        raise KernelLayerError(f"mount -t bpf bpf {path}", f"{os.strerror(err)} (errno {err})")
    log.info("mounted bpffs at %s", path)


def build_object(out_dir: Path | None = None) -> Path:
    """Builds bpf/zerolayer.bpf.o with `make -C bpf` (clang -target bpf); returns its path."""
    cmd = ["make", "-s", "-C", str(BPF_DIR)]
    if out_dir is not None:
        cmd.append(f"BUILD={out_dir}")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KernelLayerError("building the BPF object", proc.stderr.strip() or proc.stdout.strip())
    return (out_dir or BPF_DIR / "build") / "zerolayer.bpf.o"


def _iproute(netns: str | None) -> Any:
    """An rtnetlink socket in `netns` (None: this process's). flags=0: a namespace that is gone
    is an error, never created anew (pyroute2's default is O_CREAT)."""
    from pyroute2 import IPRoute

    return IPRoute(netns=netns, flags=0) if netns else IPRoute()


def _xdp_attrs(fd: int, flags: int) -> dict[str, list[tuple[str, int]]]:
    return {"attrs": [("IFLA_XDP_FD", fd), ("IFLA_XDP_FLAGS", flags)]}


@dataclass
class _TcFilter:
    ifname: str
    index: int
    parent: str
    prio: int


@dataclass
class _Attachments:
    filters: list[_TcFilter] = field(default_factory=list)
    clsact_created: list[tuple[str, int]] = field(default_factory=list)
    xdp: list[tuple[str, int, int]] = field(default_factory=list)  # ifname, index, flags


class KernelLayer:
    """The loaded BPF object, its pinned maps and what this instance attached.

    A second instance on the same pin root reuses the pinned maps, so flow state and the
    allowlist survive a daemon restart. `netns` names the network namespace whose interfaces
    `attach` works on (None: this process's)."""

    def __init__(self, object_path: Path = OBJECT_PATH, pin_root: Path = PIN_ROOT, netns: str | None = None) -> None:
        self.object_path, self.pin_root, self.netns = object_path, pin_root, netns
        self._attached = _Attachments()
        self._lock = threading.Lock()
        if not on_bpffs(pin_root) and not on_bpffs(pin_root.parent):
            if pin_root.parent != BPFFS:
                raise KernelLayerError(f"pinning under {pin_root}", f"{pin_root.parent} is not on bpffs")
            ensure_bpffs(BPFFS)
        created = not pin_root.exists()
        try:
            pin_root.mkdir(mode=0o700, exist_ok=True)
        except OSError as e:
            raise KernelLayerError(f"creating the pin directory {pin_root}", str(e)) from e
        try:
            self._load(object_path)
        except KernelLayerError:
            if created and not any(pin_root.iterdir()):
                pin_root.rmdir()
            raise
        log.info("BPF object %s loaded, maps pinned under %s", object_path.name, pin_root)

    def _load(self, object_path: Path) -> None:
        try:
            self._obj = BpfObject(object_path, self.pin_root)
        except BpfError as e:
            raise KernelLayerError(f"opening {object_path}", e.reason) from e
        try:
            self._obj.load()
            self.flows_map = BpfMap(self._obj.map_fd("flows"), FlowKey, FlowValue, "flows")
            self.ports_map = BpfMap(self._obj.map_fd("ports"), ctypes.c_uint16, ctypes.c_uint8, "ports")
            self.allow_map = BpfMap(self._obj.map_fd("allow"), LpmKey, ctypes.c_uint8, "allow")
            self.config_map = BpfMap(self._obj.map_fd("allow_config"), ctypes.c_uint32, ctypes.c_uint32,
                                     "allow_config")  # fmt: skip
            self.verdicts_map = PerCpuCounters(self._obj.map_fd("verdicts"), len(VERDICTS), "verdicts")
            self.prog_fds = {name: self._obj.program_fd(name) for name in ("zl_tc_ingress", "zl_tc_egress", "zl_xdp")}
        except BpfError as e:
            self._obj.close()
            raise KernelLayerError(f"loading {object_path.name}", e.reason) from e

    # --- configuration -----------------------------------------------------------------------

    def set_ports(self, ports: Iterable[int]) -> None:
        """The service ports (UDP and TCP) the programs count and guard."""
        wanted = {int(p) for p in ports}
        for p in wanted:
            if not 0 < p < 65536:
                raise ValueError(f"port {p} is out of range")
        for key in list(self.ports_map.iter_keys()):
            if key.value not in wanted:
                self.ports_map.delete(key)
        for p in wanted:
            self.ports_map.update(ctypes.c_uint16(p), ctypes.c_uint8(1))

    def set_allowlist(self, cidrs: Sequence[str]) -> None:
        """Client prefixes allowed to reach the service ports; empty = everyone (logged)."""
        keys = _parse_allowlist(cidrs)
        wanted = {bytes(k) for k in keys}
        if keys:
            for k in keys:  # new entries first, then enforcement, so no allowed client is refused meanwhile
                self.allow_map.update(k, ctypes.c_uint8(1))
            self.config_map.update(ctypes.c_uint32(0), ctypes.c_uint32(ENFORCE_ALLOWLIST))
        else:
            self.config_map.update(ctypes.c_uint32(0), ctypes.c_uint32(ENFORCE_ALLOW_ALL))
            _log_allow_all()
        for old in list(self.allow_map.iter_keys()):
            if bytes(old) not in wanted:
                self.allow_map.delete(old)

    def enforcing(self) -> bool:
        value = self.config_map.lookup(ctypes.c_uint32(0))
        return value is not None and value.value == ENFORCE_ALLOWLIST

    def allowed(self, addr: str) -> bool:
        """What the kernel decides for a client address (longest-prefix match on `allow`)."""
        return not self.enforcing() or self.allow_map.lookup(LpmKey.host(addr)) is not None

    # --- flows -------------------------------------------------------------------------------

    def flows(self) -> Iterator[FlowRecord]:
        for key, value in self.flows_map.items():
            yield FlowRecord.of(key, value)

    def lookup_flow(self, key: FlowKey) -> FlowRecord | None:
        value = self.flows_map.lookup(key)
        return FlowRecord.of(key, value) if value is not None else None

    def write_digests(self, key: FlowKey, digests: list[bytes]) -> None:
        """Stores the flow's last FLOW_DIGESTS prompt digests (32 bytes each). The counters are
        read and written back with them: packets counted by the kernel between the two are lost
        (a few, at most, and only in the counters)."""
        value = self.flows_map.lookup(key) or FlowValue()
        value.set_digests(digests)
        self.flows_map.update(key, value)

    def verdict_counts(self) -> dict[str, int]:
        return dict(zip(VERDICTS, self.verdicts_map.read_all(), strict=True))

    # --- attaching ---------------------------------------------------------------------------

    def _ipr(self) -> Any:
        return _iproute(self.netns)

    def attach(self, interfaces: Sequence[str], xdp: XdpMode = "off") -> None:
        """Attaches the tc programs on each interface's clsact ingress and egress (ingress only on
        loopback, where every packet passes both), and XDP where asked. On failure, what this
        call attached is removed again and KernelLayerError says why."""
        with self._lock:
            try:
                with self._ipr() as ipr:
                    for ifname in interfaces:
                        self._attach_one(ipr, ifname, xdp)
            except Exception as e:
                self._detach_locked()
                if isinstance(e, KernelLayerError):
                    raise
                raise KernelLayerError(f"attaching to {', '.join(interfaces)}", str(e)) from e

    def _attach_one(self, ipr: Any, ifname: str, xdp: XdpMode) -> None:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            raise KernelLayerError(f"attaching to {ifname}", "no such interface")
        index = int(found[0])
        link = ipr.get_links(index)[0]
        loopback = bool(link["flags"] & 0x8)  # IFF_LOOPBACK
        hooks = [(TC_INGRESS, "zl_tc_ingress")] + ([] if loopback else [(TC_EGRESS, "zl_tc_egress")])
        if not any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index=index)):
            ipr.tc("add", "clsact", index)
            self._attached.clsact_created.append((ifname, index))
        elif self._remove_stale(ipr, ifname, index):  # the clsact was an earlier run's: ours to remove
            self._attached.clsact_created.append((ifname, index))
        for parent, prog in hooks:
            used = {int(f["info"]) >> 16 for f in ipr.get_filters(index=index, parent=parent)}
            prio = next(p for p in range(1, 0xFFFF) if p not in used)  # first free: ahead of later filters
            ipr.tc("add-filter", "bpf", index, ":1", fd=self.prog_fds[prog], name=FILTER_NAME, parent=parent,
                   classid=1, direct_action=True, prio=prio)  # fmt: skip
            self._attached.filters.append(_TcFilter(ifname, index, parent, prio))
            log.info("tc %s attached on %s (%s, prio %d)", prog, ifname, parent, prio)
        if xdp != "off":
            self._remove_stale_xdp(ipr, ifname, index, link)
            flags = XDP_MODES[xdp]
            # IFLA_XDP spelled out: pyroute2's `xdp_fd=` shorthand drops `xdp_flags`. UPDATE_IF_NOEXIST:
            # an XDP program someone else attached is refused (EBUSY), never replaced.
            ipr.link("set", index=index, xdp=_xdp_attrs(self.prog_fds["zl_xdp"], flags | XDP_FLAGS_UPDATE_IF_NOEXIST))
            self._attached.xdp.append((ifname, index, flags))
            log.info("XDP attached on %s (%s)", ifname, xdp)

    @staticmethod
    def _remove_stale(ipr: Any, ifname: str, index: int) -> bool:
        """Removes our filters that an earlier run left attached (killed before it could detach:
        they would count every packet twice beside ours). True when only ours were there."""
        foreign = False
        for parent in (TC_INGRESS, TC_EGRESS):
            for f in ipr.get_filters(index=index, parent=parent):
                options = f.get_attr("TCA_OPTIONS")
                if options is None:  # the chain's own entry, not a filter
                    continue
                if options.get_attr("TCA_BPF_NAME") != FILTER_NAME:
                    foreign = True
                    continue
                prio = int(f["info"]) >> 16
                ipr.tc("del-filter", "bpf", index, ":1", parent=parent, prio=prio)
                log.warning("removed a zerolayer tc filter on %s (%s prio %d) that an earlier run left attached "
                            "(it was stopped without detaching, e.g. killed)", ifname, parent, prio)  # fmt: skip
        return not foreign

    @staticmethod
    def _remove_stale_xdp(ipr: Any, ifname: str, index: int, link: Any) -> None:
        """Removes our XDP program when an earlier run left it attached; anyone else's stays, and
        attaching then fails with EBUSY, naming the interface."""
        xdp = dict((link.get_attr("IFLA_XDP") or {}).get("attrs", []))
        prog_id = int(xdp.get("IFLA_XDP_PROG_ID") or 0)
        if not prog_id:
            return
        try:
            name = program_name(prog_id)
        except BpfError:
            return  # gone meanwhile
        if name != "zl_xdp":
            return
        mode = XDP_FLAGS_DRV_MODE if xdp.get("IFLA_XDP_ATTACHED") == "xdpdrv" else XDP_FLAGS_SKB_MODE
        ipr.link("set", index=index, xdp=_xdp_attrs(-1, mode))
        log.warning("removed a zerolayer XDP program on %s (id %d) that an earlier run left attached", ifname, prog_id)

    def detach(self) -> None:
        """Removes the filters, XDP programs and clsact qdiscs this instance added; nothing else."""
        with self._lock:
            self._detach_locked()

    def _detach_locked(self) -> None:
        att = self._attached
        if not (att.filters or att.xdp or att.clsact_created):
            return
        self._attached = _Attachments()
        try:
            ipr_ctx = self._ipr()
        except OSError as e:  # the namespace is gone, and its interfaces with what was attached to them
            log.info("kernel layer: namespace %s is gone (%s); nothing left to detach", self.netns, e)
            return
        with ipr_ctx as ipr:
            for f in att.filters:
                try:
                    ipr.tc("del-filter", "bpf", f.index, ":1", parent=f.parent, prio=f.prio)
                except Exception as e:  # the interface may be gone; that removed the filter too
                    log.warning("removing the tc filter on %s (%s prio %d): %s", f.ifname, f.parent, f.prio, e)
            for ifname, index, flags in att.xdp:
                try:
                    ipr.link("set", index=index, xdp=_xdp_attrs(-1, flags))
                except Exception as e:
                    log.warning("removing XDP on %s: %s", ifname, e)
            for ifname, index in att.clsact_created:
                try:
                    ipr.tc("del", "clsact", index)
                except Exception as e:
                    log.warning("removing the clsact qdisc on %s: %s", ifname, e)
        log.info("kernel layer detached")

    def attached_filters(self) -> list[tuple[str, str, int]]:
        """(interface, parent, prio) of the tc filters this instance holds."""
        return [(f.ifname, f.parent, f.prio) for f in self._attached.filters]

    # --- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Detaches and closes the fds; the pinned maps stay (see `unpin`)."""
        self.detach()
        self._obj.close()

    def unpin(self) -> None:
        """Removes the pinned maps and the pin directory (uninstall, tests)."""
        for name in ("flows", "ports", "allow", "allow_config", "verdicts"):
            (self.pin_root / name).unlink(missing_ok=True)
        try:
            self.pin_root.rmdir()
        except OSError as e:
            log.warning("removing %s: %s", self.pin_root, e)

    def __enter__(self) -> KernelLayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve_interfaces(
    interfaces: Sequence[str], bound_addresses: Sequence[str], netns: str | None = None
) -> list[str]:
    """`auto` stands for the interfaces that carry one of the bound addresses (loopback
    included); a wildcard address (0.0.0.0, ::) stands for every interface with an address."""
    if list(interfaces) != ["auto"]:
        return list(interfaces)
    wanted = {ipaddress.ip_address(a) for a in bound_addresses}
    wildcard = any(a.is_unspecified for a in wanted)
    names: list[str] = []
    with _iproute(netns) as ipr:
        by_index = {int(link["index"]): str(link.get_attr("IFLA_IFNAME")) for link in ipr.get_links()}
        for msg in ipr.get_addr():
            addr = msg.get_attr("IFA_ADDRESS")
            if addr is None:
                continue
            ip = ipaddress.ip_address(str(addr).split("%")[0])
            name = by_index.get(int(msg["index"]))
            if name and (wildcard or ip in wanted) and name not in names:
                names.append(name)
    if not names:
        raise KernelLayerError("resolving interfaces: auto", f"no interface carries {', '.join(bound_addresses)}")
    return names


class UserspaceFlows:
    """The kernel layer's interface without the kernel: the same FlowKey -> FlowValue records in
    an LRU bounded dict (MAX_FLOWS by default, like the `flows` map), the allowlist checked by
    the transports through `allowed()`, counters kept by `record_packet()`."""

    def __init__(self, max_flows: int = MAX_FLOWS) -> None:
        self.max_flows = max_flows
        self._flows: OrderedDict[bytes, FlowValue] = OrderedDict()
        self._allow: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self._verdicts = dict.fromkeys(VERDICTS, 0)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._flows)

    def set_ports(self, ports: Iterable[int]) -> None:
        """Nothing to filter: the transports that count here see only their own port's traffic."""

    def set_allowlist(self, cidrs: Sequence[str]) -> None:
        _parse_allowlist(cidrs)  # the same validation as the kernel's
        self._allow = [ipaddress.ip_network(c, strict=False) for c in cidrs]
        if not self._allow:
            _log_allow_all()

    def allowed(self, addr: str) -> bool:
        """The transport-level check; counted like the kernel's tc verdicts."""
        ok = True
        if self._allow:  # per datagram: parse nothing when everyone is allowed
            ip = ipaddress.ip_address(addr)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            ok = any(ip.version == n.version and ip in n for n in self._allow)
        with self._lock:
            self._verdicts["tc_pass" if ok else "tc_drop"] += 1
        return ok

    def _get(self, raw: bytes, create: bool) -> FlowValue | None:
        value = self._flows.get(raw)
        if value is None and create:
            value = self._flows[raw] = FlowValue()
            while len(self._flows) > self.max_flows:
                self._flows.popitem(last=False)
        if value is not None:
            self._flows.move_to_end(raw)
        return value

    def record_packet(self, proto: str, client: tuple[str, int], server: tuple[str, int], nbytes: int,
                      now_ns: int | None = None) -> None:  # fmt: skip
        """What the tc program does per packet, for the transports to call."""
        self._count(bytes(FlowKey.make(proto, client, server)), nbytes, now_ns)

    def _count(self, raw: bytes, nbytes: int, now_ns: int | None = None) -> None:
        with self._lock:
            value = self._get(raw, create=True)
            assert value is not None
            value.last_ns = time.monotonic_ns() if now_ns is None else now_ns
            value.packets += 1
            value.bytes += nbytes

    def udp_flow(self, client: tuple[str, int], server: tuple[str, int]) -> Callable[[int], None]:
        """A counter for one QUIC connection's datagrams, received or sent, counted as tc counts
        them (the whole frame); the key is made once, not per datagram."""
        raw = bytes(FlowKey.make("udp", client, server))
        headers = UDP_HEADER + (IPV4_HEADER if "." in client[0] else IPV6_HEADER) + ETH_HEADER
        return lambda payload_bytes: self._count(raw, payload_bytes + headers)

    def flows(self) -> Iterator[FlowRecord]:
        with self._lock:
            items = [(FlowKey.from_buffer_copy(k), v) for k, v in self._flows.items()]
        for key, value in items:
            yield FlowRecord.of(key, value)

    def lookup_flow(self, key: FlowKey) -> FlowRecord | None:
        with self._lock:
            value = self._flows.get(bytes(key))
            return FlowRecord.of(key, value) if value is not None else None

    def write_digests(self, key: FlowKey, digests: list[bytes]) -> None:
        with self._lock:
            value = self._get(bytes(key), create=True)
            assert value is not None
            value.set_digests(digests)

    def verdict_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._verdicts)

    def attach(self, interfaces: Sequence[str], xdp: XdpMode = "off") -> None:
        """Nothing to attach in userspace."""

    def detach(self) -> None:
        """Nothing attached in userspace."""

    def close(self) -> None:
        with self._lock:
            self._flows.clear()


def open_kernel_layer(mode: Mode, *, ports: Iterable[int] = (), allowlist: Sequence[str] = (),
                      interfaces: Sequence[str] = (), bound_addresses: Sequence[str] = (), xdp: XdpMode = "off",
                      object_path: Path = OBJECT_PATH, pin_root: Path = PIN_ROOT, netns: str | None = None,
                      max_flows: int = MAX_FLOWS) -> KernelLayer | UserspaceFlows:  # fmt: skip
    """The kernel layer configured and attached, or under `auto` (one warning naming the reason)
    and `off` the userspace one. Under `required` a refusal raises KernelLayerError."""
    ports = list(ports)

    def userspace() -> UserspaceFlows:
        layer = UserspaceFlows(max_flows)
        layer.set_ports(ports)
        layer.set_allowlist(allowlist)
        return layer

    if mode == "off":
        log.info("kernel layer off: flows and the allowlist are kept in userspace")
        return userspace()
    if mode not in ("required", "auto"):
        raise ValueError(f"kernel layer mode {mode!r}: expected 'required', 'auto' or 'off'")
    if max_flows != MAX_FLOWS:
        log.info("max_flows=%d applies to the userspace layer only; the kernel map holds %d", max_flows, MAX_FLOWS)
    layer: KernelLayer | None = None
    try:
        layer = KernelLayer(object_path, pin_root, netns)
        layer.set_ports(ports)
        layer.set_allowlist(allowlist)
        if interfaces:
            layer.attach(resolve_interfaces(interfaces, bound_addresses, netns), xdp)
        return layer
    except (KernelLayerError, BpfError, OSError) as e:
        if layer is not None:
            layer.close()
        err = e if isinstance(e, KernelLayerError) else KernelLayerError("setting up", str(e))
        if mode == "required":
            raise err from e
        log.warning("kernel layer unavailable, flows and the allowlist are kept in userspace: %s",
                    str(err).replace("\n", " | "))  # fmt: skip
        return userspace()
