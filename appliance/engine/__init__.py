"""The engine: ONNX Runtime generation with a shared KV buffer, sharded prefill, sampling and
prefix reuse. It yields token events and knows nothing of HTTP."""

from appliance.engine.chat import Prompt
from appliance.engine.engine import Engine, EngineConfig, Stream
from appliance.engine.errors import (
    ContextOverflow,
    EngineBusy,
    EngineError,
    EngineStopped,
    GenerationFailed,
    InvalidRequest,
)
from appliance.engine.request import Event, Finished, GenerationRequest, Message, Prefilled, TextDelta
from appliance.engine.session import ModelSession, available_devices
from appliance.engine.trace import Trace

__all__ = [
    "ContextOverflow", "Engine", "EngineBusy", "EngineConfig", "EngineError", "EngineStopped", "Event",
    "Finished", "GenerationFailed", "GenerationRequest", "InvalidRequest", "Message", "ModelSession", "Prefilled",
    "Prompt", "Stream", "TextDelta", "Trace", "available_devices",
]  # fmt: skip
