"""The stream's source: a Spark Python streaming data source that plans Kafka offset ranges.

Spark keeps planning and scheduling the work (triggers, the offset log in the checkpoint, one task
per range), but the source's rows are ranges, not records: one row ``(topic, partition, start, end)``
per partition that moved. The tasks of the batch's own job read their range with librdkafka
(:mod:`service.kafka.reader`) where they decode it, so no JVM Kafka consumer reads the records and no
record crosses from the JVM to Python. Spark's decoder, for a batch the Arrow decoder declines, gets
the records as a DataFrame read from the same ranges (:class:`service.kafka.records.KafkaRecords`).

The source's offsets have the shape of Spark's Kafka source (``{topic: {"partition": offset}}``), so
the checkpoint's offset log is read the same way (:func:`service.pipeline.positions.batch_end_offsets`).
The planning methods run in a Python process the driver's JVM starts: what they need travels in the
class (:func:`source_class`), pickled by value, never through Spark options, which the plan shows.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from service.kafka.metadata import NO_AUTO_CREATE, partitions
from service.kafka.reader import RANGE_SCHEMA, OffsetRange
from service.model.offsets import EARLIEST, Offsets, merge_offsets, offsets_from_json, offsets_to_json

logger = logging.getLogger(__name__)
FORMAT = "icesink_kafka"


@dataclass(frozen=True)
class RangePlan:
    """What the source needs to plan ranges; pickled to the planning process."""

    client: dict[str, Any]  # librdkafka properties (no logger object), the isolation level included
    topics: list[str] = field(default_factory=list)
    pattern: str | None = None
    starting: Offsets = field(default_factory=dict)  # committed offsets; EARLIEST where none
    max_offsets_per_trigger: int | None = None
    until: Offsets | None = None  # stop planning past these (catching up, then stopping)
    # A sink of many tables: when the budget can't cover every partition, whole chunks of this many for
    # some partitions (each batch others), not a thin slice for all (see cap)
    chunk: int | None = None
    timeout_s: float = 15.0

    def reads(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None and not topic.startswith("__")
        return topic in self.topics


TopicPartitionKey = tuple[str, int]


def cap(
    start: Offsets,
    latest: Offsets,
    budget: int | None,
    chunk: int | None = None,
    waited: dict[TopicPartitionKey, int] | None = None,
) -> Offsets:
    """``latest``, or short of it so that at most ``budget`` offsets are planned in all.

    As Spark's Kafka source does with ``maxOffsetsPerTrigger``, the budget is shared among the
    partitions in proportion to what each has to read (every partition with something to read gets
    at least one offset), so no partition starves behind a busy one.

    With ``chunk`` (a sink of many tables: ``SinkConfig.backlog_chunk``), the budget goes instead in
    whole chunks to some partitions, those that ``waited`` the most batches first: see
    :func:`_in_chunks`.
    """
    lag = {(t, p): max(0, o - start.get(t, {}).get(p, o)) for t, ps in latest.items() for p, o in ps.items()}
    total = sum(lag.values())
    if budget is None or total <= budget:
        return _ends(start, latest, lag)  # latest, never short of the start
    if chunk is not None:
        return _ends(start, latest, _in_chunks(lag, budget, chunk, waited or {}))
    # Floor shares first; what rounding left over goes one offset each to the partitions with the
    # most left to read, so a batch holds the whole budget (no batch of a few stragglers after it).
    shares = {tp: max(1, n * budget // total) if n else 0 for tp, n in lag.items()}
    spare = budget - sum(shares.values())
    for tp in sorted(lag, key=lambda tp: lag[tp] - shares[tp], reverse=True):
        if spare <= 0:
            break
        if lag[tp] > shares[tp]:
            shares[tp] += 1
            spare -= 1
    return _ends(start, latest, {tp: min(n, shares[tp]) for tp, n in lag.items()})


def _in_chunks(
    lag: dict[TopicPartitionKey, int], budget: int, chunk: int, waited: dict[TopicPartitionKey, int]
) -> dict[TopicPartitionKey, int]:
    """Offsets to read per partition: whole chunks for as many partitions as the budget holds.

    A backlog over many small tables, shared thinly, gives every table a few records per batch: each
    table then pays a decode and, at its commit, a snapshot for a sliver of its changes (or holds them
    batch after batch). In chunks, a batch reads ``chunk`` records (or all it has, under two chunks)
    from each partition it serves, the partitions that waited the most batches first, so every
    partition is served within about ``partitions x 2 chunks / budget`` batches; what is left of the
    budget reads further into the partitions served. The first partition in turn is served even
    when the budget is under a chunk.
    """
    order = sorted((tp for tp, n in lag.items() if n), key=lambda tp: (-waited.get(tp, 0), -lag[tp], tp))
    shares: dict[TopicPartitionKey, int] = {}
    left = budget
    for tp in order:
        n = lag[tp] if lag[tp] < 2 * chunk else chunk
        if n > left:
            if shares:
                continue  # a smaller one further on may fit
            n = left
        shares[tp] = n
        left -= n
    # What is left goes to the partitions served, in proportion to what each has left to read (the
    # floor of it), so that partitions of one busy topic stay level and their tasks even.
    rest = {tp: lag[tp] - n for tp, n in shares.items() if lag[tp] > n}
    total = sum(rest.values())
    for tp, n in rest.items():
        shares[tp] += min(n, n * left // total)
    return shares


def waits(
    start: Offsets, latest: Offsets, end: Offsets, waited: dict[TopicPartitionKey, int]
) -> dict[TopicPartitionKey, int]:
    """Batches each partition has waited with records to read, after a batch from ``start`` to ``end``."""
    out: dict[TopicPartitionKey, int] = {}
    for t, ps in latest.items():
        for p, o in ps.items():
            at = start.get(t, {}).get(p, o)
            behind, served = o > at, end.get(t, {}).get(p, at) > at
            out[(t, p)] = waited.get((t, p), 0) + 1 if behind and not served else 0
    return out


def _ends(start: Offsets, latest: Offsets, shares: dict[TopicPartitionKey, int]) -> Offsets:
    """Each partition of ``latest`` moved ``shares`` offsets on from its start (none: where it is)."""
    out: Offsets = {}
    for t, ps in sorted(latest.items()):
        for p, o in sorted(ps.items()):
            out.setdefault(t, {})[p] = start.get(t, {}).get(p, o) + shares.get((t, p), 0)
    return out


# How long the topics' partitions, asked of the broker, are taken as they were: asking costs a metadata
# request per micro-batch (of every topic in the cluster for a pattern). A topic or partition added is
# planned at most this much later.
PARTITIONS_MAX_AGE_S = 5.0
# What asking for the end offset of a deleted topic's partition answers (librdkafka finds no leader).
_GONE = {
    KafkaError._NOENT,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


class RangeReader(DataSourceStreamReader):
    def __init__(self, plan: RangePlan) -> None:
        self.plan = plan
        self._admin: AdminClient | None = None
        self._known: tuple[float, dict[str, list[int]]] | None = None  # when asked, the partitions
        self._last: Offsets | None = None  # the end of the last batch planned
        self._waited: dict[TopicPartitionKey, int] = {}  # batches a partition with records waited (cap)

    def _client(self) -> AdminClient:
        if self._admin is None:  # an admin client is a producer to librdkafka: no consumer property
            client = {k: v for k, v in self.plan.client.items() if k != "isolation.level"}
            self._admin = AdminClient({**client, **NO_AUTO_CREATE})
        return self._admin

    def _partitions(self, fresh: bool = False) -> dict[str, list[int]]:
        now = time.monotonic()
        if not fresh and self._known is not None and now - self._known[0] < PARTITIONS_MAX_AGE_S:
            return self._known[1]
        try:
            named = None if self.plan.pattern is not None else self.plan.topics
            found = partitions(self._client(), named, self.plan.timeout_s)
        except KafkaException as exc:
            raise RuntimeError(f"Kafka did not answer: {exc}") from None
        parts = {name: ps for name, ps in sorted(found.items()) if self.plan.reads(name)}
        self._known = (now, parts)
        return parts

    def _list(self, parts: dict[str, list[int]], spec: OffsetSpec) -> Offsets:
        """One request for every partition's earliest or end offset (the last stable offset under
        read_committed)."""
        if not parts:
            return {}
        committed = self.plan.client.get("isolation.level", "read_committed") == "read_committed"
        futures = self._client().list_offsets(
            {TopicPartition(t, p): spec for t, ps in parts.items() for p in ps},
            isolation_level=IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED,
            request_timeout=self.plan.timeout_s,
        )
        out: Offsets = {}
        for tp, future in futures.items():
            out.setdefault(tp.topic, {})[tp.partition] = int(future.result(self.plan.timeout_s).offset)
        return out

    def _resolve(self, offsets: Offsets, parts: dict[str, list[int]]) -> Offsets:
        """``offsets`` for every partition of ``parts``, the earliest where it has none (or EARLIEST)."""
        missing = {
            t: [p for p in ps if offsets.get(t, {}).get(p, EARLIEST) == EARLIEST] for t, ps in parts.items()
        }
        earliest = self._list({t: ps for t, ps in missing.items() if ps}, OffsetSpec.earliest())
        out: Offsets = {t: dict(ps) for t, ps in offsets.items()}
        for t, ps in earliest.items():
            out.setdefault(t, {}).update(ps)
        return out

    def initialOffset(self) -> dict[str, Any]:
        start = self._resolve(self.plan.starting, self._partitions())
        # Spark plans the first batch (latestOffset) before it asks for that batch's start: what was
        # planned must stay planned, or the next plan would start over from the committed offsets
        # and read a partition again.
        if self._last is None:
            self._last = start
        return offsets_to_json(start)

    def latestOffset(self) -> dict[str, Any]:
        asked_before = self._known
        parts = self._partitions()
        try:
            latest = self._list(parts, OffsetSpec.latest())
        except KafkaException as exc:
            # A topic deleted since the partitions were last asked has no leader: ask again, once
            # (only if they came from that earlier answer, not from one asked just now).
            from_cache = self._known is asked_before
            if not from_cache or exc.args[0].code() not in _GONE:
                raise
            logger.info("a topic's partitions are gone (%s): asking for the topics again", exc)
            parts = self._partitions(fresh=True)
            latest = self._list(parts, OffsetSpec.latest())
        start = self._resolve(self._last if self._last is not None else self.plan.starting, parts)
        if self.plan.until is not None:  # nothing past the target, and nothing of a topic born since
            latest = {
                t: {
                    p: min(o, self.plan.until[t][p]) for p, o in ps.items() if p in self.plan.until.get(t, {})
                }
                for t, ps in latest.items()
                if t in self.plan.until
            }
        end = cap(start, latest, self.plan.max_offsets_per_trigger, self.plan.chunk, self._waited)
        if self.plan.chunk is not None:  # only a plan in chunks asks who waited
            self._waited = waits(start, latest, end, self._waited)
        self._last = {t: {**start.get(t, {}), **ps} for t, ps in end.items()} | {
            t: ps for t, ps in start.items() if t not in end
        }
        return offsets_to_json(self._last)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ranges = batch_ranges(
            offsets_from_json(start), offsets_from_json(end), lambda new: self._resolve({}, new)
        )
        return [InputPartition((r.topic, r.partition, r.start, r.end)) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[tuple[str, int, int, int]]:
        yield tuple(partition.value)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the sink's offsets live in the txnlog

    def stop(self) -> None:
        self._admin = None


def batch_ranges(
    start: Offsets, end: Offsets, earliest: Callable[[dict[str, list[int]]], Offsets]
) -> list[OffsetRange]:
    """A batch's offset ranges, from where the batch before ended (``start``) to ``end``: one range per
    partition that moved. A partition born since the batch before has no start: it is read from its
    earliest offset (``earliest`` looks them up).

    The source plans its tasks' partitions with this, and the sink's read step the batch's ranges
    (:mod:`service.pipeline.read`): the source's planning runs in a Python process of its own, so the
    two can't share the result, only the rule.
    """
    born = {t: [p for p in ps if p not in start.get(t, {})] for t, ps in end.items()}
    born = {t: ps for t, ps in born.items() if ps}
    first = merge_offsets(start, earliest(born)) if born else start
    return [
        OffsetRange(t, p, first[t][p], o)
        for t, ps in sorted(end.items())
        for p, o in sorted(ps.items())
        if o > first.get(t, {}).get(p, o)
    ]


def source_class(plan: RangePlan) -> type[DataSource]:
    """A data source class bound to ``plan`` (defined here so that it is pickled by value with it)."""

    class IcesinkKafka(DataSource):
        @classmethod
        def name(cls) -> str:
            return FORMAT

        def schema(self) -> str:
            return RANGE_SCHEMA

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return RangeReader(plan)

    return IcesinkKafka
