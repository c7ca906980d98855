"""Reuse of computed KV prefixes across requests.

A prompt is cut into fixed blocks of tokens, each with a chain digest (sha256 of the previous
digest and the block's ids), so a digest names a whole prefix. The pool holds KV arrays for
prefixes, bounded in bytes and evicted least-recently-used; every block digest of an entry is
indexed, so a prompt that shares only part of a cached prefix still reuses that part.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

DIGESTS_PER_FLOW = 10


def block_digests(ids: list[int], block_tokens: int) -> list[bytes]:
    """Chain digests of every full block of ids."""
    out, prev = [], b""
    arr = np.asarray(ids, dtype="<i4")
    for i in range(len(ids) // block_tokens):
        prev = hashlib.sha256(prev + arr[i * block_tokens : (i + 1) * block_tokens].tobytes()).digest()
        out.append(prev)
    return out


# Per layer (key, value), each [kv_heads, tokens, head_size].
KVArrays = list[tuple[np.ndarray, np.ndarray]]


@dataclass
class _Entry:
    digests: list[bytes]
    kv: KVArrays
    nbytes: int


@dataclass(frozen=True)
class PrefixHit:
    tokens: int
    kv: KVArrays  # views covering exactly `tokens` tokens; copy before writing


class PrefixCache:
    def __init__(self, max_bytes: int, block_tokens: int) -> None:
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[bytes, tuple[int, int]] = {}  # digest -> (entry id, blocks)
        self._next_id = 0
        self._bytes = 0
        self.lookups = self.hits = self.reused_tokens = 0  # for the operator's metrics
        self._lock = threading.Lock()  # one pool for every device worker

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, digests: list[bytes], max_blocks: int) -> PrefixHit | None:
        """The longest cached prefix among the first max_blocks blocks of these digests."""
        with self._lock:
            self.lookups += 1
            for n in range(min(max_blocks, len(digests)), 0, -1):
                found = self._index.get(digests[n - 1])
                if found is None:
                    continue
                entry_id, blocks = found
                entry = self._entries[entry_id]
                self._entries.move_to_end(entry_id)
                t = blocks * self.block_tokens
                self.hits += 1
                self.reused_tokens += t
                return PrefixHit(t, [(k[:, :t], v[:, :t]) for k, v in entry.kv])
            return None

    def store(self, digests: list[bytes], kv: KVArrays) -> bool:
        """Keep KV for len(digests) full blocks (kv holds at least that many tokens)."""
        if not digests:
            return False
        t = len(digests) * self.block_tokens
        with self._lock:
            known = self._index.get(digests[-1])
            if known is not None and known[1] == len(digests):
                self._entries.move_to_end(known[0])
                return True
        # Always a copy: the arrays are views on a slot's KV row, which the next request overwrites.
        # (np.ascontiguousarray returned the view itself for a model with one KV head, [1, t, head]
        # being "contiguous" whatever its stride: the pool then served another request's keys.)
        kv = [(np.array(k[:, :t], order="C"), np.array(v[:, :t], order="C")) for k, v in kv]
        nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
        if nbytes > self.max_bytes:
            return False
        with self._lock:
            # An entry that is a prefix of the new one is now redundant.
            for d in digests:
                found = self._index.get(d)
                if found is not None and self._entries[found[0]].digests[-1] == d:
                    self._remove(found[0])
            entry_id, self._next_id = self._next_id, self._next_id + 1
            self._entries[entry_id] = _Entry(list(digests), kv, nbytes)
            self._bytes += nbytes
            for i, d in enumerate(digests):
                self._index[d] = (entry_id, i + 1)
            while self._bytes > self.max_bytes:
                self._remove(next(iter(self._entries)))
        return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._index.clear()
            self._bytes = 0

    def _remove(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        self._bytes -= entry.nbytes
        for d in entry.digests:
            if self._index.get(d, (None,))[0] == entry_id:
                del self._index[d]
