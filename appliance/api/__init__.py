"""The HTTP API: Anthropic Messages and OpenAI Chat Completions over one ASGI app."""

from appliance.api.app import ApiApp, ApiSettings, tag_transport
from appliance.api.auth import KeyStore
from appliance.api.metrics import Metrics

__all__ = ["ApiApp", "ApiSettings", "KeyStore", "Metrics", "tag_transport"]
