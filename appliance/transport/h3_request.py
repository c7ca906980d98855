"""One HTTP/3 request's life as a pure state machine: H3 events in, actions out; no socket, no
task, no aioquic. The connection feeds it what arrives on the request's stream and carries out
what it answers.

    RECEIVING --request ends--> RUNNING               (the app gets it)
    RECEIVING --request ends--> HELD --handshake--> RUNNING
                    (it came in 0-RTT early data and its method is unsafe: early data can be
                     replayed, and a replayed flight never completes a handshake)
    RECEIVING --bad length, too large, draining--> REJECTED   (answered here; the rest is discarded)
    any --client resets, connection goes--> ABANDONED
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # the only ones run straight from early data


class Phase(Enum):
    RECEIVING = "receiving"
    HELD = "held"
    RUNNING = "running"
    REJECTED = "rejected"
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class Start:
    """Hand the request, body complete, to the app."""


@dataclass(frozen=True)
class Reject:
    """Answer now without the app; with `stop_sending`, ask the client to stop sending the body."""

    status: int
    message: str
    stop_sending: bool


@dataclass(frozen=True)
class Cancel:
    """The client is gone: tell the app; with `reset`, reset our side (the response was unfinished)."""

    reset: bool


Action = Start | Reject | Cancel


class RequestMachine:
    def __init__(self, method: str, *, early_data: bool, max_body_bytes: int) -> None:
        self.method = method
        self.max_body_bytes = max_body_bytes
        self.phase = Phase.RECEIVING
        self.handshake_done = not early_data
        self.request_ended = False  # FIN or reset seen on the request side
        self.received = 0

    def headers(self, content_length: bytes | None, draining: bool) -> list[Action]:
        """The request's HEADERS frame arrived."""
        if draining:
            return self._reject(503, "server is shutting down")
        length = b"0" if content_length is None else content_length
        if not length.isdigit():
            return self._reject(400, "invalid content-length")
        if int(length) > self.max_body_bytes:
            return self._reject(413, "request body too large")
        return []

    def data(self, size: int) -> tuple[bool, list[Action]]:
        """Body bytes arrived: whether to keep them, and what to do."""
        if self.phase is not Phase.RECEIVING:
            return False, []
        self.received += size
        if self.received > self.max_body_bytes:
            return False, self._reject(413, "request body too large")
        return True, []

    def end(self) -> list[Action]:
        """The request side ended (FIN)."""
        self.request_ended = True
        if self.phase is not Phase.RECEIVING:
            return []
        if not self.handshake_done and self.method not in SAFE_METHODS:
            self.phase = Phase.HELD  # replayable until the handshake completes
            return []
        self.phase = Phase.RUNNING
        return [Start()]

    def handshake_completed(self) -> list[Action]:
        self.handshake_done = True
        if self.phase is Phase.HELD:
            self.phase = Phase.RUNNING
            return [Start()]
        return []

    def abandoned(self, request_side: bool, response_ended: bool) -> list[Action]:
        """The client reset the stream (`request_side`) or asked us to stop sending."""
        if request_side:
            self.request_ended = True
        if self.phase is Phase.REJECTED:
            return []
        self.phase = Phase.ABANDONED
        return [Cancel(reset=not response_ended)]

    def finished(self, app_running: bool) -> bool:
        """Nothing more to do on this stream: the exchange may be forgotten (what still arrives on a
        rejected one is dropped unread)."""
        if app_running:
            return False
        return self.phase is Phase.REJECTED or (self.request_ended and self.phase is not Phase.HELD)

    def _reject(self, status: int, message: str) -> list[Action]:
        self.phase = Phase.REJECTED
        return [Reject(status, message, stop_sending=not self.request_ended)]
