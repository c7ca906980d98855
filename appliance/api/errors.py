"""API errors, rendered in each dialect's own JSON with the right status."""

from __future__ import annotations

import json
from dataclasses import dataclass

ANTHROPIC = "anthropic"
OPENAI = "openai"

# status -> (Anthropic error type, OpenAI error type, OpenAI code)
_KINDS: dict[int, tuple[str, str, str | None]] = {
    400: ("invalid_request_error", "invalid_request_error", None),
    401: ("authentication_error", "invalid_request_error", "invalid_api_key"),
    403: ("permission_error", "invalid_request_error", "permission_denied"),
    404: ("not_found_error", "invalid_request_error", "not_found"),
    405: ("invalid_request_error", "invalid_request_error", "method_not_allowed"),
    413: ("request_too_large", "invalid_request_error", "request_too_large"),
    425: ("invalid_request_error", "invalid_request_error", "too_early"),
    429: ("rate_limit_error", "rate_limit_error", "rate_limit_exceeded"),
    500: ("api_error", "server_error", None),
    503: ("api_error", "server_error", "not_ready"),
    529: ("overloaded_error", "server_error", "overloaded"),
}


@dataclass
class ApiError(Exception):
    status: int
    message: str
    param: str | None = None
    retry_after: int | None = None
    allow: str | None = None  # for 405

    def body(self, dialect: str) -> bytes:
        anthropic_type, openai_type, code = _KINDS.get(self.status, _KINDS[500])
        if dialect == ANTHROPIC:
            doc: dict[str, object] = {"type": "error", "error": {"type": anthropic_type, "message": self.message}}
        else:
            doc = {"error": {"message": self.message, "type": openai_type, "param": self.param, "code": code}}
        return json.dumps(doc).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", b"application/json")]
        if self.retry_after is not None:
            out.append((b"retry-after", str(self.retry_after).encode()))
        if self.allow:
            out.append((b"allow", self.allow.encode()))
        return out


def busy_error(dialect: str, message: str) -> ApiError:
    """Queue full: Anthropic says 529 overloaded, OpenAI 429; both with retry-after."""
    return ApiError(529 if dialect == ANTHROPIC else 429, message, retry_after=1)
