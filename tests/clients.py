"""The official clients pointed at a test daemon (TCP with the dev CA, or the Unix socket)."""

from __future__ import annotations

import ssl
from pathlib import Path

import anthropic
import httpx2 as httpx  # the official clients' own HTTP library (httpx's successor)
import openai
from daemon_thread import RunningDaemon

from appliance.devsetup import DevSetup, write_dev_config

MODEL = "smollm2-135m-instruct"


def serve(root: Path, bundle: Path, trusted: Path, extra: str = "") -> tuple[RunningDaemon, DevSetup]:
    setup = write_dev_config(root, bundle, trusted, extra=extra)
    return RunningDaemon(setup.root).start(), setup


def trust(setup: DevSetup) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(setup.ca_cert))


def _http(running: RunningDaemon, setup: DevSetup, unix: bool) -> tuple[httpx.Client, str, str]:
    """An HTTP client, the origin and the key: the socket needs no key, but the SDKs want one."""
    if unix:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket))), "http://localhost", "unused"
    return httpx.Client(verify=trust(setup)), f"https://localhost:{running.port('tcp')}", setup.api_key


def metrics(setup: DevSetup) -> str:
    """The daemon's Prometheus text, over its Unix socket (open there without a key)."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket))) as c:
        return c.get("http://localhost/metrics").text


def metric(text: str, name: str) -> float:
    """The value of the first sample of `name` (unlabelled, or with its labels: one model served)."""
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith((name + " ", name + "{"))))


def anthropic_client(running: RunningDaemon, setup: DevSetup, unix: bool = False) -> anthropic.Anthropic:
    client, origin, key = _http(running, setup, unix)
    return anthropic.Anthropic(base_url=origin, api_key=key, http_client=client, max_retries=0)


def openai_client(running: RunningDaemon, setup: DevSetup, unix: bool = False) -> openai.OpenAI:
    client, origin, key = _http(running, setup, unix)
    return openai.OpenAI(base_url=f"{origin}/v1", api_key=key, http_client=client, max_retries=0)


# A client inside the box: the image's own Python, over the daemon's Unix socket.
BOX_CLIENT = r"""
import http.client, json, socket, sys
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect("/run/zerolayer/api.sock")
conn = Unix("localhost", timeout=60)
try:
    conn.request(sys.argv[1], sys.argv[2], body=sys.argv[3] if len(sys.argv) > 3 else None,
                 headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
except BrokenPipeError:  # a 413 is answered from the headers, and the socket closed mid-body;
    pass                 # on a Unix socket the answer stays readable
reply = conn.getresponse()
print(json.dumps({"status": reply.status, "body": reply.read().decode()}))
"""
