"""Typed engine errors. No HTTP here: the API maps each to a status in its dialect."""


class EngineError(Exception):
    """Base class: the engine could not serve the request."""


class InvalidRequest(EngineError):
    """The client's mistake: bad parameters, an empty prompt, a context overflow."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextOverflow(InvalidRequest):
    """The prompt and max_tokens need more positions than a request may hold; the numbers, where
    known, let each API word it as its own clients recognise."""

    def __init__(self, message: str, param: str | None = None, prompt_tokens: int | None = None,
                 max_tokens: int | None = None, limit: int | None = None) -> None:  # fmt: skip
        super().__init__(message, param)
        self.prompt_tokens, self.max_tokens, self.limit = prompt_tokens, max_tokens, limit


class EngineBusy(EngineError):
    """The admission queue is full; retry after a while."""


class EngineStopped(EngineError):
    """The engine is stopping (or stopped) and takes no more work."""


class GenerationFailed(EngineError):
    """A request failed in the engine for a reason of the server's own (the log has the cause);
    the other requests go on."""


class ProviderError(EngineError):
    """A device's session did not get the execution provider, or the options, it was built with."""
