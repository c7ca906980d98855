"""Where aioquic offers no public way, and only here: the server connection's stream limit, asking
a client for its certificate (mTLS), reading the certificate it sent, and whether the client has
acknowledged the end of every answer (a draining shutdown waits for it). Each reaches into
aioquic's private state; `check()` says at start-up, and tests/transport/test_http3.py in the suite, if an
aioquic upgrade moved any of it, instead of mTLS or the stream limit failing quietly."""

from __future__ import annotations

import inspect
from typing import Any

from aioquic.quic.connection import QuicConnection
from aioquic.quic.stream import QuicStreamSender


class ServerConnection(QuicConnection):
    """A QuicConnection with our stream limit and, for mTLS, a CertificateRequest.

    aioquic hard-codes 128 streams and asks for client certificates only in its own tests."""

    def __init__(self, *, max_streams: int, request_client_cert: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._local_max_streams_bidi.value = self._local_max_streams_bidi.sent = max_streams
        self._request_client_cert = request_client_cert

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        self.tls._request_client_certificate = self._request_client_cert

    @property
    def peer_certificate(self) -> Any:
        """The client's leaf certificate (cryptography's x509), or None."""
        return self.tls._peer_certificate

    @property
    def peer_certificate_chain(self) -> list[Any]:
        return list(self.tls._peer_certificate_chain)

    @property
    def answers_acknowledged(self) -> bool:
        """Whether the client has acknowledged all we sent on the request streams, to the FIN: an
        answer the app has finished may still sit in the pacer or need a retransmission, and a
        CONNECTION_CLOSE sent before then cuts it short."""
        return all(stream.sender.is_finished for stream_id, stream in self._streams.items()
                   if stream_id % 4 == 0)  # fmt: skip


def check() -> None:
    """Raise RuntimeError naming what is missing if this aioquic lacks the private state we use.

    Read from aioquic's own source rather than by building a connection, which has side effects."""
    from aioquic import tls

    connection = inspect.getsource(QuicConnection)
    context = inspect.getsource(tls.Context)
    wanted = [("QuicConnection", connection, "self._local_max_streams_bidi = "),
              ("QuicConnection", connection, "def _initialize(self, peer_cid"),
              ("tls.Context", context, "self._request_client_certificate = "),
              ("tls.Context", context, "self._peer_certificate = "),
              ("tls.Context", context, "self._peer_certificate_chain"),
              ("QuicConnection", connection, "self._streams: dict[int, QuicStream] = "),
              ("QuicStreamSender", inspect.getsource(QuicStreamSender), "self.is_finished = ")]  # fmt: skip
    missing = [f"{where}: {text.strip()}" for where, source, text in wanted if text not in source]
    if missing:
        raise RuntimeError("this aioquic moved what the HTTP/3 server relies on (mTLS, stream limit, drain): "
                           + "; ".join(missing))
