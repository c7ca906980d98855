"""Where a long prompt's prefill is cut into shards of at most max_tokens_per_shard tokens."""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class ShardPlan:
    shards: tuple[tuple[int, int], ...]  # [start, end) token ranges, covering start..total
    reason: str


def plan_shards(start: int, total: int, max_shard: int, algorithm: str, boundaries: list[int]) -> ShardPlan:
    """Cut [start, total) into shards.

    `semantic` ends a shard on the last message boundary inside it, when there is one, so shard
    edges (and so cached prefixes) line up with conversation turns; `fixed` cuts at the limit.
    A boundary in the first quarter of a shard is passed over: a run of tiny shards would cost
    more than the alignment gives.
    """
    if total - start <= max_shard:
        return ShardPlan(((start, total),), "fits in one shard")
    cuts = sorted(b for b in boundaries if start < b < total)
    shards, pos, on_boundary = [], start, 0
    while total - pos > max_shard:
        limit = pos + max_shard
        end = limit
        if algorithm == "semantic":
            i = bisect.bisect_right(cuts, limit) - 1
            if i >= 0 and cuts[i] >= pos + max(1, max_shard // 4):
                end = cuts[i]
                on_boundary += 1
        if total - end < 2 and end - 1 > pos:  # a lone last token runs other kernels (scheduler.MIN_CHUNK_TOKENS)
            end -= 1
        shards.append((pos, end))
        pos = end
    shards.append((pos, total))
    if algorithm == "semantic":
        reason = f"semantic: {on_boundary} of {len(shards) - 1} cuts on message boundaries"
    else:
        reason = f"fixed: cut every {max_shard} tokens"
    return ShardPlan(tuple(shards), reason)
