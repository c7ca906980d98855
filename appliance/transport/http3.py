"""HTTP/3 on one UDP socket: aioquic's sans-IO QUIC and H3 state machines driving one ASGI app.

This module only moves bytes and maps events: datagrams go to a `QuicConnection` chosen by
connection ID, QUIC events to an `H3Connection`, H3 events to each request's state machine
(h3_request.py), whose actions become ASGI calls, and what the app sends goes back out at once.
It adds what Hypercorn's QUIC server lacks: session tickets that survive a restart, 0-RTT that
never runs a side effect from replayable data, idle timeout, connection and stream limits, and
CONNECTION_CLOSE to every client on shutdown.

Early data (0-RTT): a request whose HEADERS arrive before the handshake completes came in early
data, which an attacker can replay. GET/HEAD/OPTIONS run at once; any other method is held until
`HandshakeCompleted` (a replayed flight never completes a handshake: the replayer lacks the
client's keys), then runs, so replayed early data never runs a POST (h3_request.py decides).
Tickets are also single use, so a replayed ClientHello finds no ticket and its early data is
dropped.

What survives a restart: with `ticket_key_path`, the session tickets issued in the last day (at
most `TicketStore.max_tickets`) are kept in that file (tickets.py: SQLite, mode 0600). A client
holding one resumes with a PSK handshake and may send early data to the new process, as long as
the new process has the same flow-control limits and client CA (their fingerprint is stored with
each ticket; RFC 9000 section 7.4.1 forbids lowering remembered limits). Connections, streams and
requests in flight do not survive: close() ends them with CONNECTION_CLOSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import unquote

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.buffer import Buffer
from aioquic.h3.connection import H3_ALPN, ErrorCode, H3Connection
from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
from aioquic.quic import events
from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
from aioquic.quic.connection import TRANSPORT_CLOSE_FRAME_CAPACITY, NetworkAddress
from aioquic.quic.crypto import CryptoPair
from aioquic.quic.packet import (
    QuicErrorCode,
    QuicFrameType,
    QuicHeader,
    QuicPacketType,
    encode_quic_retry,
    encode_quic_version_negotiation,
    pull_quic_header,
)
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.retry import QuicRetryTokenHandler
from aioquic.tls import AlertDescription, SessionTicket, load_pem_x509_certificates
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from appliance.asgi import ASGIApp, ASGIMessage, Scope
from appliance.transport import quic_private
from appliance.transport.h3_request import Action, Cancel, Reject, RequestMachine, Start
from appliance.transport.quic_private import ServerConnection
from appliance.transport.tickets import TicketStore

log = logging.getLogger(__name__)

OnHandshake = Callable[[bool, bool], None]  # (resumed, early_data)

# How long a draining shutdown waits for clients to acknowledge the ends of their answers once every
# request is done: several retransmission timeouts on any loopback or LAN path.
ACK_GRACE_SECONDS = 2.0
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})


class ClientDisconnected(OSError):
    """send() on a stream the client reset, or on a connection that is gone (ASGI asks for an OSError)."""


@dataclass(frozen=True)
class _Settings:
    max_connections: int
    max_streams: int
    max_body_bytes: int
    client_ca: Store | None  # mTLS when set
    retry: str = "auto"  # address validation: "auto" (under handshake pressure), "always", "never"
    max_handshakes: int = 64  # handshakes in progress at once
    handshake_timeout: float = 10.0  # seconds before a handshake's state is dropped

    def must_validate(self, handshakes: int) -> bool:
        """Whether a new client must first prove its address by returning a Retry token: a flood of
        spoofed Initials then costs one stateless packet each, and no connection state."""
        if self.retry == "auto":
            return handshakes >= max(1, self.max_handshakes // 4)
        return self.retry == "always"


class DatagramGate(Protocol):
    """The userspace stand-in for the kernel's tc programs (kernel.mode off, or bpf() refused):
    datagrams from sources outside the allowlist are dropped unread, the rest counted per flow."""

    def allowed(self, addr: str) -> bool: ...

    def udp_flow(self, client: tuple[str, int], server: tuple[str, int]) -> Callable[[int], None]: ...


class _CountedTransport(asyncio.DatagramTransport):
    """The server socket as one connection sends on it: each datagram is counted first, as the tc
    egress program would count it. aioquic's protocol only calls sendto()."""

    def __init__(self, transport: asyncio.DatagramTransport, count: Callable[[int], None]) -> None:
        super().__init__()
        self._transport, self._count = transport, count

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        self._count(len(data))
        self._transport.sendto(data, addr)


class _Exchange:
    """One request and its response on one bidirectional stream; the ASGI receive/send pair."""

    def __init__(self, conn: _Http3Connection, stream_id: int, scope: Scope, machine: RequestMachine) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.scope = scope
        self.method: str = scope["method"]
        self.machine = machine  # where the request is in its life (h3_request.py)
        self.body = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.response_started = False
        self.response_ended = False
        self._body_delivered = False
        self._gone = asyncio.Event()  # response done, stream reset or connection gone

    async def receive(self) -> ASGIMessage:
        # The body is read whole before the app starts (see _Http3Connection._end_request).
        if not self._body_delivered:
            self._body_delivered = True
            return {"type": "http.request", "body": bytes(self.body), "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: ASGIMessage) -> None:
        if self._gone.is_set():
            raise ClientDisconnected(f"HTTP/3 stream {self.stream_id} is closed")
        kind = message["type"]
        if kind == "http.response.start" and not self.response_started:
            self.response_started = True
            self.conn.send_headers(self.stream_id, message["status"], message.get("headers", []))
        elif kind == "http.response.body" and self.response_started:
            more = bool(message.get("more_body", False))
            body = b"" if self.method == "HEAD" else bytes(message.get("body", b""))
            if body or not more:
                self.conn.send_data(self.stream_id, body, end_stream=not more)
            if not more:
                self.finish_response()
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} (response started: {self.response_started})")

    def respond(self, status: int, error: str) -> None:
        """Answer without the app, for requests the transport refuses: the body in the request's
        API dialect, as the app would write it."""
        body = self.conn.server.refusal(self.scope, status, error)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        self.response_started = True
        self.conn.send_headers(self.stream_id, status, headers)
        self.conn.send_data(self.stream_id, body, end_stream=True)
        self.finish_response()

    def finish_response(self) -> None:
        self.response_ended = True
        self._gone.set()

    def disconnect(self) -> None:
        self._gone.set()

    async def run(self, app: ASGIApp) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except ClientDisconnected:
            pass
        except Exception:
            log.exception("ASGI app failed on %s %s", self.method, self.scope["path"])
            if self._gone.is_set():
                pass
            elif self.response_started:
                self.conn.reset(self.stream_id, ErrorCode.H3_INTERNAL_ERROR)  # the client sees a truncated body
                self.disconnect()
            else:
                self.respond(500, "internal server error")
        else:
            if self._gone.is_set():
                pass
            elif self.response_started:  # ASGI lets an app end without more_body=False
                self.conn.send_data(self.stream_id, b"", end_stream=True)
                self.finish_response()
            else:
                self.respond(500, "the app returned without a response")
        finally:
            self.conn.forget(self)


class _Http3Connection(QuicConnectionProtocol):
    """One client connection: QUIC events in, H3 events mapped to exchanges."""

    def __init__(self, server: Http3Server, header: QuicHeader, peer: NetworkAddress,
                 original_cid: bytes, retry_cid: bytes | None) -> None:  # fmt: skip
        settings = server.settings
        quic = ServerConnection(
            configuration=server.configuration,
            original_destination_connection_id=original_cid,
            retry_source_connection_id=retry_cid,  # set when the client came back with our Retry token
            session_ticket_fetcher=server.tickets.pop,
            session_ticket_handler=self._ticket_issued,
            max_streams=settings.max_streams,
            request_client_cert=settings.client_ca is not None,
        )
        super().__init__(quic)
        self._server_quic = quic
        self.server = server
        self.cids = {header.destination_cid, quic.host_cid}
        self.exchanges: dict[int, _Exchange] = {}
        self.client = _host_port(peer)
        self.local = server.local_address_for(peer)  # the flow's server side, as the kernel keys it
        self.count_datagram: Callable[[int], None] | None = None  # set when flows are counted in userspace
        self._h3: H3Connection | None = None
        self._handshake_done = False
        self._client_verified: bool | None = None
        self._closing = False
        self._detached = False
        self._flush_due = False
        self._deadline = asyncio.get_running_loop().call_later(settings.handshake_timeout, self._handshake_expired)

    def _handshake_expired(self) -> None:
        """No handshake within the limit (a spoofed or stalled client): drop its state now rather
        than at the idle timeout, so half-open connections cannot pile up."""
        if self._handshake_done or self._closing:
            return
        log.debug("QUIC handshake from %s:%d timed out; dropping it", *self.client)
        self._quic.close(error_code=QuicErrorCode.CONNECTION_REFUSED, reason_phrase="handshake timeout")
        self.transmit()
        self.server.forget(self)

    def transmit(self) -> None:
        """Send on the next turn of the event loop, once: what is queued in one turn leaves together,
        in as few datagrams as fit (a handshake flight with the answer to a GET in early data; a
        response's headers with its first events), instead of a datagram per send()."""
        if not self._flush_due and not self._detached:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if not self._detached:  # after shutdown the socket is gone; let aioquic's timer run dry
            super().transmit()

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.ProtocolNegotiated) and self._h3 is None:
            self._h3 = H3Connection(self._quic)
        elif isinstance(event, events.HandshakeCompleted):
            self._handshake_completed(event)
        elif isinstance(event, events.ConnectionIdIssued):
            self.cids.add(event.connection_id)
            self.server.route(event.connection_id, self)
        elif isinstance(event, events.ConnectionIdRetired):
            self.cids.discard(event.connection_id)
            self.server.unroute(event.connection_id)
        elif isinstance(event, events.ConnectionTerminated):
            self._deadline.cancel()
            self._disconnect_all()
            self.server.forget(self)
        if self._h3 is None or self._closing:
            return
        for h3_event in self._h3.handle_event(event):
            self._h3_event_received(h3_event)
        if isinstance(event, events.StreamReset | events.StopSendingReceived):
            self._stream_abandoned(event.stream_id, request_side=isinstance(event, events.StreamReset))

    @property
    def answers_acknowledged(self) -> bool:
        return self._server_quic.answers_acknowledged

    def shutdown(self) -> None:
        """CONNECTION_CLOSE now; no more sending after it."""
        self.close(error_code=ErrorCode.H3_NO_ERROR, reason_phrase="server shutting down")
        self._flush()  # now: the socket closes before the next turn
        self._disconnect_all()
        self._detached = True

    # called by exchanges

    def send_headers(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        fields = [(b":status", str(status).encode())]
        fields += [(k.lower(), v) for k, v in headers if k.lower() not in _HOP_BY_HOP]  # forbidden in HTTP/3
        assert self._h3 is not None
        self._h3.send_headers(stream_id, fields)
        self.transmit()

    def send_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        assert self._h3 is not None
        self._h3.send_data(stream_id, data, end_stream=end_stream)
        self.transmit()  # flushed on this turn of the loop: a streamed token waits for no network event

    def reset(self, stream_id: int, error_code: int) -> None:
        self._quic.reset_stream(stream_id, error_code)
        self.transmit()

    def forget(self, ex: _Exchange) -> None:
        ex.task = None
        if ex.machine.finished(app_running=False) and self.exchanges.get(ex.stream_id) is ex:
            del self.exchanges[ex.stream_id]

    # private

    def _handshake_completed(self, event: events.HandshakeCompleted) -> None:
        self._deadline.cancel()
        if self.server.settings.client_ca is not None and not event.session_resumed and not self._verify_client():
            missing = self._server_quic.peer_certificate is None
            alert = AlertDescription.certificate_required if missing else AlertDescription.bad_certificate
            self._closing = True
            self._quic.close(error_code=QuicErrorCode.CRYPTO_ERROR + alert, reason_phrase="client certificate refused")
            return
        self._handshake_done = True
        self.server.handshake_completed(self, event.session_resumed, event.early_data_accepted)
        for ex in list(self.exchanges.values()):
            self._act(ex, ex.machine.handshake_completed())

    def _h3_event_received(self, event: H3Event) -> None:
        if isinstance(event, HeadersReceived):
            ex = self.exchanges.get(event.stream_id)
            if ex is None:
                ex = self._open(event)
            if event.stream_ended:  # with the headers, or trailers: nothing in them for us
                self._act(ex, ex.machine.end())
        elif isinstance(event, DataReceived) and (ex := self.exchanges.get(event.stream_id)) is not None:
            keep, actions = ex.machine.data(len(event.data))
            if keep:
                ex.body += event.data
            self._act(ex, actions)
            if event.stream_ended:
                self._act(ex, ex.machine.end())

    def _open(self, event: HeadersReceived) -> _Exchange:
        early_data = not self._handshake_done
        machine = RequestMachine(next((v.decode("latin-1") for k, v in event.headers if k == b":method"), ""),
                                 early_data=early_data, max_body_bytes=self.server.settings.max_body_bytes)  # fmt: skip
        ex = _Exchange(self, event.stream_id, self._scope(event.headers, early_data), machine)
        self.exchanges[event.stream_id] = ex
        length = next((v for k, v in event.headers if k == b"content-length"), None)
        self._act(ex, machine.headers(length, self.server.draining))
        return ex

    def _act(self, ex: _Exchange, actions: list[Action]) -> None:
        """Carry out what the request's state machine decided."""
        for action in actions:
            if isinstance(action, Start):
                ex.task = self.server.spawn(ex.run(self.server.app))
            elif isinstance(action, Reject):
                ex.body.clear()
                ex.respond(action.status, action.message)
                if action.stop_sending:
                    with contextlib.suppress(ValueError):  # the stream may already be gone at the QUIC layer
                        self._quic.stop_stream(ex.stream_id, ErrorCode.H3_NO_ERROR)
                    self.transmit()
            elif isinstance(action, Cancel):
                ex.disconnect()
                if action.reset:
                    with contextlib.suppress(ValueError, AssertionError):
                        self.reset(ex.stream_id, ErrorCode.H3_REQUEST_CANCELLED)
        if ex.machine.finished(app_running=ex.task is not None) and self.exchanges.get(ex.stream_id) is ex:
            del self.exchanges[ex.stream_id]

    def _stream_abandoned(self, stream_id: int, request_side: bool) -> None:
        ex = self.exchanges.get(stream_id)
        if ex is not None:
            self._act(ex, ex.machine.abandoned(request_side, ex.response_ended))

    def _disconnect_all(self) -> None:
        for ex in self.exchanges.values():
            ex.disconnect()
        self.exchanges.clear()

    def _scope(self, headers: list[tuple[bytes, bytes]], early_data: bool) -> Scope:
        pseudo = {k: v for k, v in headers if k.startswith(b":")}
        fields = [(k, v) for k, v in headers if not k.startswith(b":")]
        if b":authority" in pseudo and not any(k == b"host" for k, _ in fields):
            fields.insert(0, (b"host", pseudo[b":authority"]))  # apps build URLs from Host
        raw_path, _, query = pseudo.get(b":path", b"").partition(b"?")
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "3",
            "method": pseudo.get(b":method", b"").decode("ascii", "replace"),
            "scheme": "https",
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": fields,
            "client": self.client,
            "server": self.local,
            "extensions": {"zerolayer": {"transport": "http3", "early_data": early_data}},
        }

    def _ticket_issued(self, ticket: SessionTicket) -> None:
        # A ticket resumes without a certificate, so under mTLS only a verified client may get one.
        if self.server.settings.client_ca is None or self._verify_client():
            self.server.tickets.add(ticket)

    def _verify_client(self) -> bool:
        if self._client_verified is None:
            store, cert, verified = self.server.settings.client_ca, self._server_quic.peer_certificate, False
            if store is not None and cert is not None:
                verifier = PolicyBuilder().store(store).build_client_verifier()
                with contextlib.suppress(VerificationError, ValueError):
                    verifier.verify(cert, self._server_quic.peer_certificate_chain)
                    verified = True
            self._client_verified = verified
        return self._client_verified


# scope, status, message -> the JSON error body
Refusal = Callable[[Scope, int, str], bytes]


def plain_refusal(scope: Scope, status: int, message: str) -> bytes:
    return json.dumps({"error": {"message": message}}).encode()


class Http3Server(asyncio.DatagramProtocol):
    """The UDP endpoint: routes datagrams to connections by connection ID, accepts or refuses new ones."""

    def __init__(self, app: ASGIApp, configuration: QuicConfiguration, settings: _Settings, tickets: TicketStore,
                 on_handshake: OnHandshake | None, gate: DatagramGate | None = None,
                 refusal: Refusal | None = None) -> None:  # fmt: skip
        self.app = app
        self.refusal = refusal or plain_refusal
        self.configuration = configuration
        self.settings = settings
        self.tickets = tickets
        self.draining = False
        self.address: tuple[str, int] = ("", 0)
        self._wildcard = False
        self._on_handshake = on_handshake
        self.gate = gate  # the userspace flow table and allowlist, where the kernel's programs are not loaded
        self._transport: asyncio.DatagramTransport | None = None
        self._routes: dict[bytes, _Http3Connection] = {}
        self._live: set[_Http3Connection] = set()
        self._handshaking: set[_Http3Connection] = set()  # live ones whose handshake has not completed
        self._tasks: set[asyncio.Task[None]] = set()
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closing: asyncio.Task[None] | None = None
        self._closed = False
        self._retry = QuicRetryTokenHandler()  # a key per process: tokens live seconds (RFC 9000 8.1.2)

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def connections(self) -> int:
        return len(self._live)

    @property
    def routed_ids(self) -> int:
        """Connection IDs that route datagrams to a connection (each connection has one or more;
        none may outlive its connection)."""
        return len(self._routes)

    @property
    def active_streams(self) -> int:
        return sum(len(conn.exchanges) for conn in self._live)

    @property
    def answers_acknowledged(self) -> bool:
        """Whether every client has acknowledged the ends of the answers it was sent."""
        return all(conn.answers_acknowledged for conn in self._live)

    @property
    def handshakes(self) -> int:
        """Connections whose handshake has not completed yet (asked for every new Initial, so kept,
        not counted: a flood must not cost a pass over every connection per datagram)."""
        return len(self._handshaking)

    def _retry_packet(self, header: QuicHeader, addr: NetworkAddress) -> bytes:
        assert header.version is not None
        retry_cid = os.urandom(self.configuration.connection_id_length)
        token = self._retry.create_token(address=addr, original_destination_connection_id=header.destination_cid,
                                         retry_source_connection_id=retry_cid,
                                         now=asyncio.get_running_loop().time())  # fmt: skip
        return encode_quic_retry(version=header.version, source_cid=retry_cid, destination_cid=header.source_cid,
                                 original_destination_cid=header.destination_cid, retry_token=token)  # fmt: skip

    async def close(self, drain_timeout: float = 0) -> None:
        """Refuse new connections, give requests in flight up to `drain_timeout` seconds, then send
        CONNECTION_CLOSE to every client, cancel what still runs and close the socket."""
        if self._closing is None:
            self._closing = asyncio.create_task(self._close(drain_timeout))
        await asyncio.shield(self._closing)

    async def _close(self, drain_timeout: float) -> None:
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_timeout
        while self.active_streams and loop.time() < deadline:
            await asyncio.sleep(0.02)
        # The ends of finished answers may still be in the pacer or need resending; a client that has
        # gone never acknowledges them, so they get a short grace, not the whole drain.
        acked_by = min(deadline, loop.time() + ACK_GRACE_SECONDS)
        while not self.answers_acknowledged and loop.time() < acked_by:
            await asyncio.sleep(0.02)
        self._closed = True
        for conn in list(self._live):
            conn.shutdown()
        self._live.clear()
        self._handshaking.clear()
        self._routes.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._transport is not None:
            self._transport.close()
            await self._lost
        self.tickets.close()

    # asyncio.DatagramProtocol

    def reload_certificate(self, certfile: Path, keyfile: Path) -> None:
        """New connections present the new certificate; established ones keep theirs."""
        self.configuration.load_cert_chain(certfile, keyfile)

    def local_address_for(self, peer: NetworkAddress) -> tuple[str, int]:
        """The address this server answers `peer` from: the bound one, or on a wildcard bind the
        one the routing table picks (a UDP connect sends nothing). The flow table is keyed by it,
        as the kernel sees the packets."""
        if not self._wildcard:
            return self.address
        try:
            with socket.socket(socket.AF_INET6 if ":" in str(peer[0]) else socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect(peer)
                return _host_port(probe.getsockname())[0], self.address[1]
        except OSError:
            return self.address

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)
        self.address = _host_port(transport.get_extra_info("sockname"))
        self._wildcard = ipaddress.ip_address(self.address[0]).is_unspecified  # [::] or 0.0.0.0

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._lost.done():
            self._lost.set_result(None)

    def datagram_received(self, data: bytes, addr: NetworkAddress) -> None:
        if self._closed or self._transport is None:
            return
        gate = self.gate
        if gate is not None and not gate.allowed(str(addr[0])):
            return  # as the kernel would: no answer at all, not even to a handshake
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=self.configuration.connection_id_length)
        except ValueError:
            return
        versions = self.configuration.supported_versions
        # Never answer a version negotiation packet with another: two spoofed servers would loop.
        if header.packet_type != QuicPacketType.VERSION_NEGOTIATION and header.version not in (None, *versions):
            vn = encode_quic_version_negotiation(
                source_cid=header.destination_cid, destination_cid=header.source_cid, supported_versions=versions
            )
            self._transport.sendto(vn, addr)
            return
        conn = self._routes.get(header.destination_cid)
        if conn is None:
            if header.packet_type != QuicPacketType.INITIAL or len(data) < SMALLEST_MAX_DATAGRAM_SIZE:
                return
            handshakes = self.handshakes
            if self.draining or len(self._live) >= self.settings.max_connections:
                # Refuse rather than queue; stateless, so a flood costs no TLS work.
                self._transport.sendto(_refusal(header), addr)
                return
            original_cid, retry_cid = header.destination_cid, None
            if header.token or self.settings.must_validate(handshakes):
                if not header.token:
                    self._transport.sendto(self._retry_packet(header, addr), addr)
                    return
                try:
                    original_cid = self._retry.validate_token(address=addr, destination_cid=header.destination_cid,
                                                              token=header.token, now=asyncio.get_running_loop().time())
                except ValueError:
                    return  # forged, expired or from another address: no state, no answer
                retry_cid = header.destination_cid
            if handshakes >= self.settings.max_handshakes:  # even with a proven address: a budget
                self._transport.sendto(_refusal(header), addr)
                return
            conn = _Http3Connection(self, header, addr, original_cid, retry_cid)
            if gate is not None:
                conn.count_datagram = gate.udp_flow(conn.client, conn.local)
            conn.connection_made(self._transport if conn.count_datagram is None else
                                 _CountedTransport(self._transport, conn.count_datagram))  # fmt: skip
            self._live.add(conn)
            self._handshaking.add(conn)
            for cid in conn.cids:
                self._routes[cid] = conn
        if conn.count_datagram is not None:
            conn.count_datagram(len(data))
        conn.datagram_received(data, addr)

    # called by connections

    def route(self, cid: bytes, conn: _Http3Connection) -> None:
        self._routes[cid] = conn

    def unroute(self, cid: bytes) -> None:
        self._routes.pop(cid, None)

    def forget(self, conn: _Http3Connection) -> None:
        self._live.discard(conn)
        self._handshaking.discard(conn)
        for cid in conn.cids:
            if self._routes.get(cid) is conn:
                del self._routes[cid]

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def handshake_completed(self, conn: _Http3Connection, resumed: bool, early_data: bool) -> None:
        self._handshaking.discard(conn)
        if self._on_handshake is not None:
            try:
                self._on_handshake(resumed, early_data)
            except Exception:  # a metrics hook must not break the connection
                log.exception("on_handshake hook failed")


async def serve_http3(
    app: ASGIApp,
    *,
    host: str = "::",
    port: int = 0,
    certfile: Path,
    keyfile: Path,
    ticket_key_path: Path | None,
    idle_timeout: float = 60.0,
    max_connections: int = 1024,
    retry: str = "auto",
    max_handshakes: int = 64,
    handshake_timeout: float = 10.0,
    max_streams_per_connection: int = 128,
    max_data: int = 16 << 20,
    max_stream_data: int = 1 << 20,
    max_body_bytes: int = 1 << 20,
    ca_certs: Path | None = None,
    on_handshake: OnHandshake | None = None,
    sock: socket.socket | None = None,
    gate: DatagramGate | None = None,
    refusal: Refusal | None = None,
) -> Http3Server:
    """Serve `app` over HTTP/3 on UDP `host`:`port` (port 0 picks one; "::" is dual-stack), or on
    `sock`, an already bound UDP socket (systemd socket activation).
    `gate`: drop and count datagrams in userspace, as the kernel's programs would.
    `refusal`: the error body for requests refused before the app sees them (the API's dialect).

    `ticket_key_path` is the session ticket store file (None: tickets live in memory only).
    `ca_certs` turns on mTLS: a client must present a certificate this CA bundle verifies."""
    for name, value in [("idle_timeout", idle_timeout), ("max_connections", max_connections),
                        ("max_handshakes", max_handshakes), ("handshake_timeout", handshake_timeout),
                        ("max_streams_per_connection", max_streams_per_connection), ("max_data", max_data),
                        ("max_stream_data", max_stream_data), ("max_body_bytes", max_body_bytes)]:  # fmt: skip
        if value <= 0:
            raise ValueError(f"serve_http3: {name} must be positive, got {value}")
    configuration = QuicConfiguration(is_client=False, alpn_protocols=H3_ALPN, idle_timeout=idle_timeout,
                                      max_data=max_data, max_stream_data=max_stream_data)  # fmt: skip
    configuration.load_cert_chain(certfile, keyfile)
    client_ca = None
    fingerprint = f"{max_data}/{max_stream_data}/{max_streams_per_connection}"
    if ca_certs is not None:
        pem = ca_certs.read_bytes()
        client_ca = Store(load_pem_x509_certificates(pem))
        fingerprint += "/" + hashlib.sha256(pem).hexdigest()
    quic_private.check()  # mTLS and the stream limit depend on it: say so now, not per connection
    if retry not in ("auto", "always", "never"):
        raise ValueError(f"serve_http3: retry must be auto, always or never, got {retry!r}")
    settings = _Settings(max_connections, max_streams_per_connection, max_body_bytes, client_ca, retry,
                         max_handshakes, handshake_timeout)  # fmt: skip
    tickets = TicketStore(ticket_key_path, fingerprint)
    if sock is None:
        sock = bind_udp(host, port)
    loop = asyncio.get_running_loop()
    _, server = await loop.create_datagram_endpoint(
        lambda: Http3Server(app, configuration, settings, tickets, on_handshake, gate, refusal), sock=sock
    )
    return server


def bind_udp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "::" serves IPv4 too
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


def _host_port(addr: Any) -> tuple[str, int]:
    host = str(addr[0])
    return (host.removeprefix("::ffff:") if "." in host else host), int(addr[1])  # unmap IPv4 on dual-stack


def _refusal(header: QuicHeader) -> bytes:
    """A server Initial with CONNECTION_CLOSE(CONNECTION_REFUSED), built without connection state."""
    assert header.version is not None
    crypto = CryptoPair()
    crypto.setup_initial(cid=header.destination_cid, is_client=False, version=header.version)
    builder = QuicPacketBuilder(host_cid=header.destination_cid, is_client=False, peer_cid=header.source_cid,
                                version=header.version, max_datagram_size=SMALLEST_MAX_DATAGRAM_SIZE)  # fmt: skip
    builder.start_packet(QuicPacketType.INITIAL, crypto)
    reason = b"server busy"
    buf = builder.start_frame(QuicFrameType.TRANSPORT_CLOSE, capacity=TRANSPORT_CLOSE_FRAME_CAPACITY + len(reason))
    buf.push_uint_var(QuicErrorCode.CONNECTION_REFUSED)
    buf.push_uint_var(QuicFrameType.PADDING)  # no frame caused it
    buf.push_uint_var(len(reason))
    buf.push_bytes(reason)
    datagrams, _ = builder.flush()
    return datagrams[0]
