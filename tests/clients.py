"""The official clients pointed at a test daemon (TCP with the dev CA, or the Unix socket)."""

from __future__ import annotations

import ssl
from pathlib import Path

import anthropic
import httpx2 as httpx  # the official clients' own HTTP library (httpx's successor)
import openai

from appliance.devsetup import DevSetup, RunningDaemon, write_dev_config

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


def anthropic_client(running: RunningDaemon, setup: DevSetup, unix: bool = False) -> anthropic.Anthropic:
    client, origin, key = _http(running, setup, unix)
    return anthropic.Anthropic(base_url=origin, api_key=key, http_client=client, max_retries=0)


def openai_client(running: RunningDaemon, setup: DevSetup, unix: bool = False) -> openai.OpenAI:
    client, origin, key = _http(running, setup, unix)
    return openai.OpenAI(base_url=f"{origin}/v1", api_key=key, http_client=client, max_retries=0)
