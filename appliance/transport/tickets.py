"""TLS session tickets for QUIC resumption and 0-RTT: single use, kept in SQLite so a client can
resume with a new daemon process (see the HTTP/3 server's note on what survives a restart)."""

from __future__ import annotations

import datetime
import json
import os
import sqlite3
import time
from pathlib import Path

from aioquic.tls import CipherSuite, SessionTicket


class TicketStore:
    """TLS session tickets by ticket id, single use, in SQLite (`path`) or in memory (`path=None`).

    Rows carry a fingerprint of the server settings a resumed client remembers; rows with another
    fingerprint are dropped on open. The newest `max_tickets` are kept."""

    max_tickets = 10_000

    def __init__(self, path: Path | None, fingerprint: str) -> None:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # SQLite's -wal/-shm copy this mode
        self._db = sqlite3.connect(":memory:" if path is None else path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a crash may lose recent tickets: a full handshake
        self._db.execute("CREATE TABLE IF NOT EXISTS tickets (id BLOB PRIMARY KEY, expires REAL NOT NULL, "
                         "fingerprint TEXT NOT NULL, ticket TEXT NOT NULL)")  # fmt: skip
        self._db.execute("DELETE FROM tickets WHERE expires < ? OR fingerprint != ?", (time.time(), fingerprint))
        self._fingerprint = fingerprint

    def add(self, ticket: SessionTicket) -> None:
        cur = self._db.execute(
            "INSERT OR REPLACE INTO tickets VALUES (?, ?, ?, ?)",
            (ticket.ticket, ticket.not_valid_after.timestamp(), self._fingerprint, _encode_ticket(ticket)),
        )
        if cur.lastrowid is not None and cur.lastrowid > self.max_tickets:
            self._db.execute("DELETE FROM tickets WHERE rowid <= ?", (cur.lastrowid - self.max_tickets,))

    def pop(self, ticket_id: bytes) -> SessionTicket | None:
        row = self._db.execute("DELETE FROM tickets WHERE id = ? RETURNING ticket", (ticket_id,)).fetchone()
        return None if row is None else _decode_ticket(ticket_id, row[0])

    def __len__(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM tickets").fetchone()[0])

    def close(self) -> None:
        self._db.close()


def _encode_ticket(t: SessionTicket) -> str:
    return json.dumps({
        "age_add": t.age_add, "cipher_suite": int(t.cipher_suite), "server_name": t.server_name,
        "not_valid_before": t.not_valid_before.timestamp(), "not_valid_after": t.not_valid_after.timestamp(),
        "resumption_secret": t.resumption_secret.hex(), "max_early_data_size": t.max_early_data_size,
        "other_extensions": [[kind, data.hex()] for kind, data in t.other_extensions],
    })  # fmt: skip


def _decode_ticket(ticket_id: bytes, text: str) -> SessionTicket:
    d = json.loads(text)
    utc = datetime.UTC
    return SessionTicket(
        age_add=d["age_add"], cipher_suite=CipherSuite(d["cipher_suite"]), server_name=d["server_name"],
        not_valid_before=datetime.datetime.fromtimestamp(d["not_valid_before"], utc),
        not_valid_after=datetime.datetime.fromtimestamp(d["not_valid_after"], utc),
        resumption_secret=bytes.fromhex(d["resumption_secret"]), ticket=ticket_id,
        max_early_data_size=d["max_early_data_size"],
        other_extensions=[(kind, bytes.fromhex(data)) for kind, data in d["other_extensions"]],
    )  # fmt: skip
