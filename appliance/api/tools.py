"""What the dialects share about tools: checking a tool definition and a JSON schema, a tool
call's id and its arguments, a conversation's turns with their tool results, and the answer as
text plus calls."""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from appliance.api.errors import ApiError
from appliance.api.fields import Hint, check_hints, get_str, reject_unknown
from appliance.engine.request import Message, PromptLogprobs, TokenLogprob
from appliance.engine.tools import PastCall, Tool

MAX_TOOLS = 128
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")  # what both APIs accept as a tool name


@dataclass
class CallOut:
    """A tool call the model made: its name and its arguments' JSON text (as generated)."""

    id: str
    name: str
    arguments: str = ""

    def input(self) -> dict[str, Any] | None:
        """The arguments as an object; None if they were cut off (max_tokens) before they closed."""
        try:
            value = json.loads(self.arguments)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None


@dataclass
class Answer:
    """A whole answer: its text, the calls it made in order, its tokens' log probabilities (None
    when the request did not ask), a reasoning model's thought before it, and a scored prompt's
    log probabilities."""

    text: str = ""
    calls: list[CallOut] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    thought: str = ""
    prompt: PromptLogprobs | None = None


def new_call_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def schema_object(value: Any, where: str, param: str) -> dict[str, Any]:
    """A JSON schema given as an object (its content is checked when the grammar is compiled)."""
    if not isinstance(value, dict):
        raise ApiError(400, f"{where}: must be a JSON schema object", param=param)
    return value


def strict_flag(doc: dict[str, Any], where: str, param: str) -> bool:
    """A tool's or a format's `strict`: absent or null is False (the schema is followed where the
    grammar can express it, see engine.tools.grammar)."""
    value = doc.get("strict")
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{where}strict: must be true or false", param=param)
    return bool(value)


def make_tool(name: Any, description: Any, schema: Any, where: str, param: str, strict: bool = False) -> Tool:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ApiError(400, f"{where}.name: must be 1 to 128 letters, digits, '_' or '-'", param=param)
    if description is not None and not isinstance(description, str):
        raise ApiError(400, f"{where}.description: must be a string", param=param)
    schema = schema_object({} if schema is None else schema, f"{where} schema", param)
    kind = schema.get("type", "object")
    if kind != "object":
        raise ApiError(400, f"{where} schema: a tool's arguments must be an object (type 'object', not {kind!r})",
                       param=param)  # fmt: skip
    return Tool(name, description or "", schema, strict)


# The APIs' newer fields on a tool, as each checks them (tool_extras). Examples, eager streaming and
# an output schema are hints (this server streams arguments as they are generated anyway);
# deferred loading and callers other than the model belong to tool search and code execution,
# which this server has none of.
_TOOL_HINTS: dict[str, Hint] = {"input_examples": list, "eager_input_streaming": bool, "output_schema": dict,
                                "defer_loading": bool, "async": bool, "allowed_callers": list}  # fmt: skip


def tool_extras(tool: dict[str, Any], where: str, param: str) -> None:
    check_hints(tool, _TOOL_HINTS, f"{where}.", param)
    if tool.get("defer_loading"):
        raise ApiError(400, f"{where}.defer_loading: deferred tools (loaded by tool search) are not supported by this "
                       "server: send the tools the model may call", param=param)  # fmt: skip
    if tool.get("async"):
        raise ApiError(400, f"{where}.async: asynchronous tools are not supported by this server", param=param)
    callers = tool.get("allowed_callers")
    if callers is not None and "direct" not in callers:
        raise ApiError(400, f"{where}.allowed_callers: only the model calls tools here (no code execution): "
                       "include 'direct'", param=param)  # fmt: skip


def tool_items(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The request's `tools` list, each item an object, with where it is for error messages."""
    raw = doc.get("tools") or []
    if not isinstance(raw, list):
        raise ApiError(400, "tools: must be a list", param="tools")
    items = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ApiError(400, f"tools[{i}]: must be an object", param="tools")
        items.append((f"tools[{i}]", item))
    return items


def check_tools(tools: list[Tool], param: str) -> tuple[Tool, ...]:
    if len(tools) > MAX_TOOLS:
        raise ApiError(400, f"{param}: at most {MAX_TOOLS} tools are allowed ({len(tools)} sent)", param=param)
    names = [t.name for t in tools]
    for name in names:
        if names.count(name) > 1:
            raise ApiError(400, f"{param}: tool names must be unique ({name!r} appears {names.count(name)} times)",
                           param=param)  # fmt: skip
    return tuple(tools)


def arguments_text(value: Any, where: str, param: str) -> str:
    """An earlier call's arguments, for the prompt: an object, or JSON text of one."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            raise ApiError(400, f"{where}: must be JSON text of an object", param=param) from None
    if not isinstance(value, dict):
        raise ApiError(400, f"{where}: must be an object", param=param)
    return json.dumps(value, ensure_ascii=False)



def chat_turns(raw: Any, read: Callable[[dict[str, Any], str], Message]) -> tuple[str | None, tuple[Message, ...]]:
    """A chat API's `messages` as the model's turns, each read by `read` (a tool's result as a
    user turn of results alone): the system messages before the first other turn are the system
    text, joined (a later one stays where it is: the chat template places it), and consecutive
    tool results are one user turn."""
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "messages: must be a non-empty list", param="messages")
    system: list[str] = []
    out: list[Message] = []
    results = False  # the last turn is tool results, which the next ones join
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ApiError(400, f"messages[{i}]: must be an object", param="messages")
        turn = read(m, f"messages[{i}]")
        if turn.results and not turn.content:
            if results:
                out[-1] = dataclasses.replace(out[-1], results=out[-1].results + turn.results)
            else:
                out.append(turn)
            results = True
            continue
        results = False
        if turn.role == "system" and not out:
            system.append(turn.content)
        else:
            out.append(turn)
    if not out:
        raise ApiError(400, "messages: needs at least one user message", param="messages")
    return ("\n\n".join(system) or None), tuple(out)


def past_calls(raw: Any, where: str) -> tuple[PastCall, ...]:
    """An assistant message's `tool_calls` (OpenAI's, and Ollama's alike): each a function with its
    name and arguments (JSON text or an object), for the prompt."""
    calls = raw or []
    if not isinstance(calls, list):
        raise ApiError(400, f"{where}.tool_calls: must be a list", param="messages")
    past = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise ApiError(400, f"{at}: must be an object with a function", param="messages")
        reject_unknown(call, {"id", "type", "function"}, {}, where=f"{at}.")
        fn = call["function"]
        name = get_str(fn, "name", required=True, where=f"{at}.function.")
        past.append(PastCall(str(name), arguments_text(fn.get("arguments") or {}, f"{at}.function.arguments",
                                                       "messages")))  # fmt: skip
    return tuple(past)
