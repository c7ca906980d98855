"""Reuse of computed KV prefixes across requests.

A prompt is cut into fixed blocks of tokens, each with a chain digest (sha256 of the previous
digest and the block's ids), so a digest names a whole prefix. The pool holds KV arrays for
prefixes, bounded in bytes and evicted least-recently-used; every block digest of an entry is
indexed, so a prompt that shares only part of a cached prefix still reuses that part.

An entry is a chain of segments: a prefix that extends one already held (the next turn of a
conversation) copies only its new positions and shares the rest, so keeping a 2000-token
conversation's turn costs the worker its new tokens, not all 2000 (90 MB for the demo model). A
segment's bytes count once however many entries share it.

A hybrid model's recurrent layers (session.StateSpec) sum the whole sequence up in a state, which
cannot be cut at a block: its entries end where a request's prompt or answer did, with the tokens
past the last full block (`tail`) and the states there, and are reused only whole
(`lookup_with_states`). Such an entry is not redundant when a longer one extends it (its states
are not the longer one's), so entries with states are only evicted.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

DIGESTS_PER_FLOW = 10
# Entries with states whose blocks end at one digest (prompts that differ only past their last full
# block: one system prompt, many short questions): each lookup there compares their tails.
MAX_TAILS_PER_BLOCK = 32


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
# Positions [start, end) of the request's KV row, per layer (views are fine: the pool copies them).
Export = Callable[[int, int], KVArrays]


@dataclass(eq=False)
class _Segment:
    kv: KVArrays  # its own copy, never written
    nbytes: int
    refs: int = 0  # entries holding it


@dataclass
class _Entry:
    digests: list[bytes]
    # (first position, segment, positions of it used), in order, covering every block: an entry
    # that shares the start of a longer one's segment uses the segment itself, so it counts once.
    segments: list[tuple[int, _Segment, int]]
    tail: tuple[int, ...] = ()  # the token ids past the last full block (an entry with states)
    states: list[np.ndarray] | None = None  # a hybrid model's recurrent states after the tail
    state_bytes: int = 0


@dataclass(frozen=True)
class PrefixHit:
    tokens: int
    segments: list[tuple[int, KVArrays]]  # (first position, views), exactly `tokens` tokens in all; copy to write
    states: list[np.ndarray] | None = None  # the recurrent states after `tokens` (never written: copy to write)


class PrefixCache:
    def __init__(self, max_bytes: int, block_tokens: int) -> None:
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[bytes, tuple[int, int]] = {}  # digest -> (entry id, blocks)
        self._ends: dict[bytes, list[int]] = {}  # digest -> the entries with states whose blocks end there
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
            found = self._longest(digests[:max_blocks])
            if found is None:
                return None
            entry_id, blocks = found
            self._entries.move_to_end(entry_id)
            return self._hit(entry_id, blocks * self.block_tokens)

    def lookup_with_states(self, digests: list[bytes], ids: list[int], max_tokens: int) -> PrefixHit | None:
        """The longest entry with states (`store`'s `tail` and `states`) that the prompt `ids`
        (whose block digests these are) begins with, of at most `max_tokens` tokens: reused whole."""
        block = self.block_tokens
        with self._lock:
            self.lookups += 1
            for n in range(min(len(digests), max_tokens // block), 0, -1):
                fits = [(len(e.tail), i) for i in self._ends.get(digests[n - 1], ())
                        if n * block + len((e := self._entries[i]).tail) <= max_tokens
                        and tuple(ids[n * block : n * block + len(e.tail)]) == e.tail]  # fmt: skip
                if fits:
                    entry_id = max(fits)[1]
                    self._entries.move_to_end(entry_id)
                    return self._hit(entry_id, n * block + len(self._entries[entry_id].tail))
            return None

    def _hit(self, entry_id: int, t: int) -> PrefixHit:
        """The first `t` tokens of an entry (under the lock)."""
        entry = self._entries[entry_id]
        self.hits += 1
        self.reused_tokens += t
        return PrefixHit(t, [(start, [(k[:, : min(used, t - start)], v[:, : min(used, t - start)]) for k, v in seg.kv])
                             for start, seg, used in entry.segments if start < t], entry.states)  # fmt: skip

    def store(self, digests: list[bytes], export: Export, tail: list[int] | None = None,
              states: list[np.ndarray] | None = None) -> bool:  # fmt: skip
        """Keep KV for len(digests) full blocks; `export(start, end)` gives the positions the pool
        does not hold yet (it is called once, for the span after the longest prefix held). With
        `states` (a hybrid model's, after the blocks and the `tail` ids past them), the entry holds
        the tail's positions too, and is reused only whole."""
        if not digests:
            return False
        ends = tuple(tail or ()) if states is not None else ()
        t = len(digests) * self.block_tokens + len(ends)
        with self._lock:
            found = self._longest(digests)
            held = found[0] if found is not None and found[1] == len(digests) and states is None else None
            if states is not None:
                held = next((i for i in self._ends.get(digests[-1], ()) if self._entries[i].tail == ends), None)
            if held is not None:
                self._entries.move_to_end(held)
                return True
            # The segments of the longest prefix held, up to its end: shared, not copied.
            shared: list[tuple[int, _Segment, int]] = []
            base = 0
            if found is not None:
                base = found[1] * self.block_tokens
                shared = [(start, seg, min(used, base - start))
                          for start, seg, used in self._entries[found[0]].segments if start < base]  # fmt: skip
        views = export(base, t)
        nbytes = sum(k.nbytes + v.nbytes for k, v in views)
        state_bytes = sum(a.nbytes for a in states or ())
        if nbytes + state_bytes + sum(seg.nbytes for _, seg, _ in shared) > self.max_bytes:
            return False  # a prompt larger than the pool: refused before anything is copied
        # Always a copy: the arrays are views on a slot's KV row, which the next request overwrites.
        # (np.ascontiguousarray returned the view itself for a model with one KV head, [1, t, head]
        # being "contiguous" whatever its stride: the pool then served another request's keys.)
        kv = [(np.array(k, order="C"), np.array(v, order="C")) for k, v in views]
        segments = [*shared, (base, _Segment(kv, nbytes), t - base)]
        kept = [np.array(a, order="C") for a in states] if states is not None else None
        with self._lock:
            # An entry that is a prefix of the new one is now redundant (unless it keeps states).
            for d in digests:
                known = self._index.get(d)
                if known is not None and (old := self._entries[known[0]]).digests[-1] == d and old.states is None:
                    self._remove(known[0])
            entry_id, self._next_id = self._next_id, self._next_id + 1
            self._entries[entry_id] = _Entry(list(digests), segments, ends, kept, state_bytes)
            for _, seg, _ in segments:
                if seg.refs == 0:
                    self._bytes += seg.nbytes
                seg.refs += 1
            self._bytes += state_bytes
            for i, d in enumerate(digests):
                self._index[d] = (entry_id, i + 1)
            if kept is not None:
                tails = self._ends.setdefault(digests[-1], [])
                tails.append(entry_id)
                if len(tails) > MAX_TAILS_PER_BLOCK:  # lookups scan these: the oldest goes
                    self._remove(tails[0])
            while self._bytes > self.max_bytes:
                self._remove(next(iter(self._entries)))
        return True

    def clear(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                for _, seg, _ in entry.segments:
                    seg.refs = 0  # a store in flight that shares one counts its bytes again
            self._entries.clear()
            self._index.clear()
            self._ends.clear()
            self._bytes = 0

    def _longest(self, digests: list[bytes]) -> tuple[int, int] | None:
        """(entry id, blocks) of the longest prefix of these digests held."""
        for n in range(len(digests), 0, -1):
            found = self._index.get(digests[n - 1])
            if found is not None:
                return found
        return None

    def _remove(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        for _, seg, _ in entry.segments:
            seg.refs -= 1
            if seg.refs == 0:
                self._bytes -= seg.nbytes
        self._bytes -= entry.state_bytes
        for d in entry.digests:
            if self._index.get(d, (None,))[0] == entry_id:
                del self._index[d]
        if entry.states is not None:
            ends = self._ends[entry.digests[-1]]
            ends.remove(entry_id)
            if not ends:
                del self._ends[entry.digests[-1]]
