"""Typed engine errors: the API maps each to a status code and its dialect's error JSON."""


class EngineError(Exception):
    """Base class. `status` is the HTTP status a transport should answer with."""

    status = 500


class InvalidRequest(EngineError):
    """The client's mistake: bad parameters, an empty prompt, a context overflow."""

    status = 400

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextOverflow(InvalidRequest):
    pass


class EngineBusy(EngineError):
    """The admission queue is full; retry after a while."""

    status = 429


class EngineStopped(EngineError):
    status = 503
