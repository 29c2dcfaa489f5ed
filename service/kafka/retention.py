"""Committed offsets against what Kafka still holds.

The txnlog's committed offsets are where the sink resumes. They stop meaning anything when
retention (or a delete-records call) removed records the sink had not read yet, or when the topic
was deleted and re-created under the same name: offsets start again at 0 in a topic with a new id.
Left alone, Spark's source fails the first case at every start (its data-loss check, a crash loop)
and reads the re-created topic from the old offsets, skipping its first records without a word.
The sink checks at start-up, stops with exit 2 naming each partition, and an operator moves on with
``icesink offsets reset`` (:mod:`service.ops.offsets_reset`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from service.config import KafkaConfig
from service.kafka.lookups import SourceError, consumer, watermarks
from service.model.offsets import Offsets


@dataclass(frozen=True)
class Problem:
    """A committed offset Kafka no longer holds; ``partition`` is None when the whole topic is affected."""

    topic: str
    partition: int | None
    text: str

    def __str__(self) -> str:
        return self.text


class OffsetsGone(SourceError):
    """Committed offsets point at records Kafka no longer holds, or into a re-created topic."""

    def __init__(self, sink_id: str, problems: list[Problem]) -> None:
        self.problems = problems
        listed = "\n  ".join(str(p) for p in problems)
        super().__init__(
            f"sink {sink_id}: Kafka no longer holds what the committed offsets point at:\n  {listed}\n"
            "The sink stops rather than skip or re-read records unannounced. To move on: "
            "`icesink offsets reset --config <file> --to earliest` (read what is left; the missing "
            "records never reach the table) or `--to latest` (see docs/operations.md)."
        )


def find_problems(
    kafka: KafkaConfig,
    parts: Mapping[str, list[int]],
    current_ids: Mapping[str, str],
    committed: Offsets | None,
    committed_ids: Mapping[str, str],
) -> list[Problem]:
    """What of the ``committed`` offsets (of topics with ``committed_ids``) Kafka no longer holds, for
    the topics the sink reads.

    The end of a partition is taken as the log's end (read_uncommitted), not the last stable offset:
    an offset beyond the end is then beyond anything ever written, whatever the isolation level.
    Plans written before topic ids were recorded carry none; their topics are checked by offsets only.
    """
    if committed is None:
        return []
    problems: list[Problem] = []
    to_check: dict[str, dict[int, int]] = {}
    for topic, current in parts.items():
        offsets = committed.get(topic)
        if not offsets:
            continue
        old, new = committed_ids.get(topic), current_ids.get(topic)
        gone = sorted(set(offsets) - set(current))
        if old is not None and new is not None and old != new:
            problems.append(recreated(topic, old, new, offsets))
        elif gone:
            problems.append(
                Problem(
                    topic,
                    None,
                    f"topic {topic}: partition(s) {gone} have committed offsets but no longer exist "
                    "(the topic was re-created with fewer partitions)",
                )
            )
        else:
            to_check[topic] = dict(offsets)
    if not to_check:
        return problems
    client = consumer(kafka, "check", isolation_level="read_uncommitted")
    try:
        marks = watermarks(client, {t: sorted(offsets) for t, offsets in to_check.items()})
    finally:
        client.close()
    for topic, offsets in to_check.items():
        for p, offset in sorted(offsets.items()):
            earliest, end = marks[(topic, p)]
            if offset < earliest:
                problems.append(
                    Problem(
                        topic,
                        p,
                        f"topic {topic} partition {p}: committed offset {offset}, earliest offset {earliest}: "
                        f"{earliest - offset} record(s) were deleted (retention or delete-records) before "
                        "the sink read them",
                    )
                )
            elif offset > end:
                problems.append(
                    Problem(
                        topic,
                        p,
                        f"topic {topic} partition {p}: committed offset {offset} is past the partition's "
                        f"end {end} (earliest offset {earliest}): the partition was truncated or the topic "
                        "re-created",
                    )
                )
    return problems


def recreated(topic: str, old_id: str, new_id: str, offsets: Mapping[int, int]) -> Problem:
    committed = json.dumps({str(p): o for p, o in sorted(offsets.items())})
    return Problem(
        topic,
        None,
        f"topic {topic} was deleted and re-created (topic id {old_id}, now {new_id}): its committed "
        f"offsets {committed} belong to the old topic",
    )


def check_committed(
    sink_id: str,
    kafka: KafkaConfig,
    parts: Mapping[str, list[int]],
    current_ids: Mapping[str, str],
    committed: Offsets | None,
    committed_ids: Mapping[str, str],
) -> None:
    """Raise :class:`OffsetsGone` when Kafka no longer holds what ``committed`` points at."""
    problems = find_problems(kafka, parts, current_ids, committed, committed_ids)
    if problems:
        raise OffsetsGone(sink_id, problems)
