"""A small HTTP/3 client on aioquic's sans-IO connection, for the handshake kinds niquests hides:
cold (full handshake), resumed with a session ticket, 0-RTT (requests in early data) and warm.
The benchmark times requests with it; the HTTP/3 tests drive the server with it (through
aioquic's `connect`, which it also fits).

Close does not wait out QUIC's closing period: CONNECTION_CLOSE is sent and the socket dropped, as
a client that is done would, so a cold request's cost is its handshake and exchange, not a timer.
Like the server, it sends once per turn of the event loop, so a ClientHello and the requests in
early data leave in one datagram, and so do a handshake's Finished and the ACKs that follow it.
It offers one key share (X25519), as OpenSSL's client (the HTTPS paths' TLS) does by default:
aioquic's client makes four (P-256, P-384, X25519, X448) for every handshake, which a profile
showed as a sizeable part of a cold request's client CPU.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, QuicEvent, StreamReset
from aioquic.tls import Group, SessionTicket

FIRST_TOKEN = b"content_block_delta"  # the first SSE event that carries generated text
StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], None]  # what aioquic's connect() passes


@dataclass
class Exchange:
    """One request's timings (perf_counter seconds) and answer."""

    stream_id: int
    started: float
    finished: asyncio.Future[None]
    sent_wall: float = 0.0  # time.time() when the request was handed to QUIC (for the captures)
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    first_token: float = 0.0
    done: float = 0.0
    body: bytearray = field(default_factory=bytearray)

    def json(self) -> Any:
        return json.loads(self.body)


class H3Client(QuicConnectionProtocol):
    def __init__(self, quic: QuicConnection, stream_handler: StreamHandler | None = None) -> None:
        super().__init__(quic, stream_handler)
        self.h3 = H3Connection(quic)
        self.exchanges: dict[int, Exchange] = {}
        self.tickets: list[SessionTicket] = []
        self.handshake: HandshakeCompleted | None = None
        self.terminated: ConnectionTerminated | None = None
        self._flush_due = False

    def transmit(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if self._transport is not None and not self._transport.is_closing():
            super().transmit()

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, HandshakeCompleted):
            self.handshake = event
        for ev in self.h3.handle_event(event):
            ex = self.exchanges.get(getattr(ev, "stream_id", -1))
            if ex is None:
                continue
            if isinstance(ev, HeadersReceived):
                ex.headers = dict(ev.headers)
                ex.status = int(ex.headers.get(b":status", b"0"))
            elif isinstance(ev, DataReceived):
                if not ex.first_token and FIRST_TOKEN in ev.data:
                    ex.first_token = time.perf_counter()
                ex.body += ev.data
            if isinstance(ev, HeadersReceived | DataReceived) and ev.stream_ended:
                self._finish(ex, None)
        if isinstance(event, StreamReset) and (ex := self.exchanges.get(event.stream_id)) is not None:
            self._finish(ex, ConnectionResetError(f"stream reset {event.error_code}"))
        if isinstance(event, ConnectionTerminated):
            self.terminated = event
            for ex in self.exchanges.values():
                self._finish(ex, ConnectionError(f"connection closed: {event.reason_phrase}"))

    def _finish(self, ex: Exchange, error: Exception | None) -> None:
        if ex.finished.done():
            return
        ex.done = time.perf_counter()
        if error is None:
            ex.finished.set_result(None)
        else:
            ex.finished.set_exception(error)

    def start(self, method: str, path: str, body: bytes = b"", headers: Sequence[tuple[bytes, bytes]] = (), *,
              authority: str = "localhost", started: float | None = None) -> Exchange:  # fmt: skip
        """Queue a request and send what QUIC allows now (in early data on a 0-RTT connection).
        No content-length unless `headers` carry one."""
        stream_id = self._quic.get_next_available_stream_id()
        fields = [(b":method", method.encode()), (b":scheme", b"https"), (b":authority", authority.encode()),
                  (b":path", path.encode()), *headers]  # fmt: skip
        loop = asyncio.get_running_loop()
        ex = Exchange(stream_id, time.perf_counter() if started is None else started, loop.create_future(), time.time())
        self.exchanges[stream_id] = ex
        self.h3.send_headers(stream_id, fields, end_stream=not body)
        if body:
            self.h3.send_data(stream_id, body, end_stream=True)
        self.transmit()
        return ex

    async def reply(self, ex: Exchange) -> Exchange:
        """The exchange once its answer has ended (raises if its stream or connection failed)."""
        await ex.finished
        return ex

    async def request(self, method: str, path: str, body: bytes = b"",
                      headers: Sequence[tuple[bytes, bytes]] = ()) -> Exchange:  # fmt: skip
        return await self.reply(self.start(method, path, body, headers))

    def cancel(self, ex: Exchange, error_code: int) -> None:
        """Abandon a request as a client that gives up does: STOP_SENDING and RESET_STREAM."""
        self._quic.stop_stream(ex.stream_id, error_code)
        self._quic.reset_stream(ex.stream_id, error_code)
        self.transmit()

    def close_reason(self) -> tuple[int, str]:
        """The error code and reason of the CONNECTION_CLOSE that ended the connection."""
        assert self.terminated is not None, "the connection has not ended"
        return self.terminated.error_code, self.terminated.reason_phrase

    def close_now(self) -> None:
        """CONNECTION_CLOSE, then drop the socket without waiting out the closing period."""
        self.close()
        self._flush()
        if self._transport is not None:
            self._transport.close()


class _OneKeyShare(QuicConnection):
    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        self.tls._supported_groups = [Group.X25519]


def client_configuration(ca_pem: bytes, server_name: str, ticket: SessionTicket | None = None) -> QuicConfiguration:
    """The CA is passed as PEM bytes so a client making a connection per request parses no file."""
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=server_name)
    config.load_verify_locations(cadata=ca_pem)
    config.session_ticket = ticket
    return config


async def open_connection(host: str, port: int, config: QuicConfiguration, *, wait_connected: bool) -> H3Client:
    """A connected (or, with wait_connected=False, connecting) client; 0-RTT when config has a ticket.
    Session tickets the server issues collect in `client.tickets`."""
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    tickets: list[SessionTicket] = []
    quic = _OneKeyShare(configuration=config, session_ticket_handler=tickets.append)
    local = ("::" if family == socket.AF_INET6 else "0.0.0.0", 0)
    _, client = await loop.create_datagram_endpoint(lambda: H3Client(quic), family=family, local_addr=local)
    client.tickets = tickets
    client.connect((host, port), transmit=False)  # the first flush takes early data along
    client.transmit()
    if wait_connected:
        await client.wait_connected()
    return client
