"""API errors: a status, a message and what the client should do. Each dialect renders them in its
own JSON (appliance/api/dialect.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def not_served(model: str, served: Sequence[str]) -> str:
    """Why a model name gets 404, naming the models the client may ask for instead."""
    names = ", ".join(f"`{name}`" for name in served) or "none (no firmware is loaded)"
    return f"The model `{model}` does not exist on this appliance; it serves {names}"


@dataclass
class ApiError(Exception):
    status: int
    message: str
    param: str | None = None
    retry_after: int | None = None
    allow: str | None = None  # for 405
    details: dict[str, object] | None = None  # machine-readable reason where a dialect defines one
    code: str | None = None  # OpenAI's error code, where it is not the status's own

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", b"application/json")]
        if self.retry_after is not None:
            out.append((b"retry-after", str(self.retry_after).encode()))
        if self.allow:
            out.append((b"allow", self.allow.encode()))
        return out
