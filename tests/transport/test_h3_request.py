"""The HTTP/3 request state machine with no socket: what runs, what waits for the handshake, what
is refused, what a client's reset does."""

from __future__ import annotations

from appliance.transport.h3_request import Cancel, Phase, Reject, RequestMachine, Start


def _machine(method: str = "POST", early_data: bool = False, limit: int = 100) -> RequestMachine:
    return RequestMachine(method, early_data=early_data, max_body_bytes=limit)


def test_a_complete_request_starts_the_app_once() -> None:
    m = _machine()
    assert m.headers(b"10", draining=False) == []
    assert m.data(10) == (True, [])
    assert m.end() == [Start()]
    assert m.phase is Phase.RUNNING and not m.finished(app_running=True) and m.finished(app_running=False)
    assert m.handshake_completed() == []  # nothing starts twice


def test_an_unsafe_request_in_early_data_waits_for_the_handshake() -> None:
    m = _machine("POST", early_data=True)
    m.headers(None, draining=False)
    assert m.end() == [] and m.phase is Phase.HELD
    assert not m.finished(app_running=False)  # kept, to be started
    assert m.handshake_completed() == [Start()] and m.phase is Phase.RUNNING


def test_a_safe_request_in_early_data_runs_at_once() -> None:
    for method in ("GET", "HEAD", "OPTIONS"):
        m = _machine(method, early_data=True)
        m.headers(None, draining=False)
        assert m.end() == [Start()]


def test_a_request_that_ends_after_the_handshake_completed_runs() -> None:
    m = _machine("POST", early_data=True)  # headers came in early data
    m.headers(b"3", draining=False)
    m.handshake_completed()
    m.data(3)
    assert m.end() == [Start()]


def test_a_declared_or_counted_body_over_the_limit_is_413_and_the_rest_is_dropped() -> None:
    declared = _machine(limit=100)
    assert declared.headers(b"101", draining=False) == [Reject(413, "request body too large", stop_sending=True)]
    assert declared.data(50) == (False, []) and declared.end() == []
    assert declared.finished(app_running=False)
    counted = _machine(limit=100)
    counted.headers(None, draining=False)
    assert counted.data(60) == (True, [])
    keep, actions = counted.data(60)
    assert not keep and actions == [Reject(413, "request body too large", stop_sending=True)]
    assert counted.end() == []  # never starts


def test_bad_length_and_draining_are_refused_before_the_app() -> None:
    assert _machine().headers(b"12x", draining=False) == [Reject(400, "invalid content-length", stop_sending=True)]
    assert _machine().headers(b"0", draining=True) == [Reject(503, "server is shutting down", stop_sending=True)]


def test_a_reset_cancels_the_app_and_resets_an_unfinished_response() -> None:
    m = _machine("GET")
    m.headers(None, draining=False)
    m.end()
    assert m.abandoned(request_side=True, response_ended=False) == [Cancel(reset=True)]
    assert m.phase is Phase.ABANDONED and m.finished(app_running=False)
    done = _machine("GET")
    done.headers(None, draining=False)
    done.end()
    assert done.abandoned(request_side=False, response_ended=True) == [Cancel(reset=False)]


def test_a_held_request_the_client_abandons_never_starts() -> None:
    m = _machine("POST", early_data=True)
    m.headers(None, draining=False)
    m.end()
    m.abandoned(request_side=True, response_ended=False)
    assert m.handshake_completed() == []
