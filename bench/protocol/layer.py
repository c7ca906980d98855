"""The "layer" service of the design Zerolayer replaces, for the layered baseline.

Behind the nginx gateway: `POST /v1/layer/negotiate` reads the caller's API key, looks up the
client's record in Redis (`layer:client:<sha256 of the key>`, a JSON document naming its model
endpoint) and answers 302 to that endpoint, with the record as JSON. Anything else is 404.
An ASGI app served by Hypercorn over plain HTTP/1.1, with redis-py's asyncio client (one pool).

Run: python -m bench.protocol.layer --host 127.0.0.1 --port P --redis-port R
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from typing import Any

import redis.asyncio as aioredis
from hypercorn.asyncio import serve
from hypercorn.config import Config

Receive = Any
Send = Any


def record_key(api_key: str) -> str:
    return "layer:client:" + hashlib.sha256(api_key.encode()).hexdigest()


class LayerApp:
    def __init__(self, store: aioredis.Redis) -> None:
        self.store = store

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while True:  # read the body whole, as a JSON API would
            message = await receive()
            if not message.get("more_body"):
                break
        headers = dict(scope["headers"])
        if scope["method"] != "POST" or scope["path"] != "/v1/layer/negotiate":
            await _answer(send, 404, {"error": "not found"})
            return
        api_key = headers.get(b"x-api-key", b"").decode()
        raw = await self.store.get(record_key(api_key)) if api_key else None
        if raw is None:
            await _answer(send, 401, {"error": "unknown client"})
            return
        record = json.loads(raw)
        await _answer(send, 302, record, [(b"location", record["endpoint"].encode())])


async def _answer(send: Send, status: int, doc: Any, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(doc).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def main(host: str, port: int, redis_host: str, redis_port: int) -> None:
    store = aioredis.Redis(host=redis_host, port=redis_port, max_connections=64)
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.keep_alive_timeout = 75
    print(f"layer service on {host}:{port}, redis {redis_host}:{redis_port}", flush=True)
    await serve(LayerApp(store), config, mode="asgi")  # type: ignore[arg-type]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the layered baseline's negotiate service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis-host", default="127.0.0.1")
    parser.add_argument("--redis-port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port, args.redis_host, args.redis_port))
