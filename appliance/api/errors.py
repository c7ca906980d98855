"""API errors: a status, a message and what the client should do. Each dialect renders them in its
own JSON (appliance/api/dialect.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ApiError(Exception):
    status: int
    message: str
    param: str | None = None
    retry_after: int | None = None
    allow: str | None = None  # for 405

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", b"application/json")]
        if self.retry_after is not None:
            out.append((b"retry-after", str(self.retry_after).encode()))
        if self.allow:
            out.append((b"allow", self.allow.encode()))
        return out
