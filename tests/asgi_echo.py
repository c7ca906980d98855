"""A tiny ASGI app for transport tests: it records what it saw, in order, in `log`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


class EchoApp:
    """GET /stream...?N: N chunks 0.15 s apart; GET /wait: waits for http.disconnect; POST /count:
    increments `posts`; any other request: JSON of what the transport passed in."""

    def __init__(self) -> None:
        self.posts = 0
        self.log: list[tuple[Any, ...]] = []  # shared with on_handshake hooks by tests
        self.disconnected = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:  # fmt: skip
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        early = scope["extensions"]["zerolayer"]["early_data"]
        self.log.append(("request", scope["method"], scope["path"], early))
        if scope["path"].startswith("/stream"):
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            for i in range(int(scope["query_string"] or 3)):
                await send({"type": "http.response.body", "body": f"{scope['path']}:{i}\n".encode(), "more_body": True})
                await asyncio.sleep(0.15)
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["path"] == "/wait":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"waiting\n", "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
            return
        if scope["method"] == "POST" and scope["path"] == "/count":
            self.posts += 1
            reply: dict[str, Any] = {"count": self.posts, "early_data": early, "body_len": len(body)}
        else:
            reply = {
                "method": scope["method"], "path": scope["path"], "query": scope["query_string"].decode(),
                "early_data": early, "http_version": scope["http_version"], "client": list(scope["client"]),
                "host": dict(scope["headers"]).get(b"host", b"").decode(),
            }  # fmt: skip
        data = json.dumps(reply).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})
