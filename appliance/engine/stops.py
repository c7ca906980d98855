"""Stop sequences over a text stream: never emit text that could still become a stop sequence."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stop_sequences: tuple[str, ...]) -> None:
        self.stops = stop_sequences
        self.held = ""
        self.rest = ""  # what followed the stop sequence in the text that matched it

    def push(self, text: str) -> tuple[str, str | None]:
        """Feed text; return (text safe to emit, the stop sequence that matched or None)."""
        if not self.stops:
            return text, None
        buf = self.held + text
        best: tuple[int, str] | None = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            self.held, self.rest = "", buf[best[0] + len(best[1]) :]
            return buf[: best[0]], best[1]
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:n]):
                    hold = n
                    break
        self.held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], None

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out
