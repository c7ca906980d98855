"""The per-request decision trace: small, and readable by an operator."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Trace:
    request_id: str
    device: str = ""
    input_tokens: int = 0
    shard_size: int = 0
    shards: int = 0
    shard_reason: str = ""
    reused_tokens: int = 0
    prior_digests_found: int = 0
    prior_digests_total: int = 0
    digests: list[bytes] = field(default_factory=list)  # chain digests of the prompt's last ten blocks
    prefill_ms: float = 0.0
    decode_tokens: int = 0
    decode_ms: float = 0.0
    max_token_ms: float = 0.0
    notes: list[str] = field(default_factory=list)  # what the governor and transports add

    def record_token(self, ms: float) -> None:
        self.decode_tokens += 1
        self.decode_ms += ms
        self.max_token_ms = max(self.max_token_ms, ms)

    @property
    def ms_per_token(self) -> float:
        return self.decode_ms / self.decode_tokens if self.decode_tokens else 0.0

    def lines(self) -> list[str]:
        return [
            f"[DEBUG] Shard decision: input_tokens={self.input_tokens}, shard_size={self.shard_size} -> "
            f"{self.shards} shard{'s' if self.shards != 1 else ''} ({self.shard_reason})",
            f"[DEBUG] Cache lookup: found {self.prior_digests_found}/{self.prior_digests_total} digests, "
            f"reused {self.reused_tokens} of {self.input_tokens} prompt tokens",
            f"[DEBUG] Engine run: device={self.device}, prefill {self.prefill_ms:.0f} ms, "
            f"{self.decode_tokens} tokens at {self.ms_per_token:.1f} ms/token",
            *(f"[DEBUG] {note}" for note in self.notes),
        ]
