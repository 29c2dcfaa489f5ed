"""Kafka offsets as the sink records them: topic → partition → the next offset to read."""

from __future__ import annotations

# topic → partition → next offset to read (exclusive end of what a commit covers)
Offsets = dict[str, dict[int, int]]
EARLIEST = -2  # Spark's startingOffsets for "the earliest offset": a partition's start before it is resolved


def offsets_to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    return {topic: {str(p): o for p, o in sorted(parts.items())} for topic, parts in sorted(offsets.items())}


def offsets_from_json(obj: dict[str, dict[str, int]] | None) -> Offsets:
    return {topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in (obj or {}).items()}


def merge_offsets(base: Offsets, newer: Offsets) -> Offsets:
    merged = {topic: dict(parts) for topic, parts in base.items()}
    for topic, parts in newer.items():
        merged.setdefault(topic, {}).update(parts)
    return merged
