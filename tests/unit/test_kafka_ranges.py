"""How the task reader's source shares ``kafka.max_offsets_per_trigger`` among partitions."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import OffsetSpec

from service.kafka import metadata
from service.kafka import stream_source as ranges
from service.kafka.stream_source import RangePlan, RangeReader, cap, waits
from service.model.offsets import Offsets, offsets_from_json


def test_no_budget_plans_everything() -> None:
    assert cap({"t": {0: 5}}, {"t": {0: 50, 1: 7}}, None) == {"t": {0: 50, 1: 7}}


def test_a_batch_holds_the_whole_budget_despite_rounding() -> None:
    end = cap({"t": {0: 0, 1: 0}}, {"t": {0: 80_003, 1: 79_997}}, 20_000)
    assert sum(end["t"].values()) == 20_000
    assert abs(end["t"][0] - end["t"][1]) <= 10  # shared in proportion to what each has to read


def test_a_small_partition_is_not_starved_by_a_busy_one() -> None:
    end = cap({"a": {0: 0}, "b": {0: 100}}, {"a": {0: 1_000_000}, "b": {0: 103}}, 1_000)
    assert end["b"][0] > 100
    assert end["a"][0] <= 1_000


def test_a_partition_with_nothing_to_read_stays_put() -> None:
    end = cap({"a": {0: 10, 1: 4}}, {"a": {0: 10, 1: 9}}, 2)
    assert end == {"a": {0: 10, 1: 6}}


def test_a_backlog_of_many_small_tables_is_read_in_whole_chunks() -> None:
    start = {f"t{i:03}": {0: 0} for i in range(100)}
    latest = {t: {0: 1_600} for t in start}
    end = cap(start, latest, 20_000, chunk=1_000)
    moved = [end[t][0] for t in start if end[t][0]]
    # under two chunks left: the partition's whole backlog, so no table is left with a sliver
    assert moved == [1_600] * 12
    assert sum(moved) <= 20_000


def test_every_partition_is_served_in_turn_when_reading_in_chunks() -> None:
    start: dict[str, dict[int, int]] = {f"t{i:03}": {0: 0} for i in range(100)}
    latest = {t: {0: 5_000} for t in start}
    latest["t000"][0] = 1_000_000  # a busy table among quiet ones
    waited: dict[tuple[str, int], int] = {}
    served_in: list[set[str]] = []
    for _ in range(9):
        end = cap(start, latest, 20_000, chunk=1_000, waited=waited)
        waited = waits(start, latest, end, waited)
        served_in.append({t for t in start if end[t][0] > start[t][0]})
        assert sum(end[t][0] - start[t][0] for t in start) == 20_000
        start = end
    # 100 partitions, 20 chunks a batch: each served once in the first five batches, then again
    assert set().union(*served_in[:5]) == set(latest)
    assert all(len(s) == 20 for s in served_in)
    assert max(waited.values()) < 5


def test_a_budget_under_one_chunk_still_moves() -> None:
    end = cap({"a": {0: 0}, "b": {0: 0}}, {"a": {0: 5_000}, "b": {0: 5_000}}, 300, chunk=1_000)
    assert sorted(v[0] for v in end.values()) == [0, 300]


class _Broker(RangeReader):
    """The source's planning with the broker's answers given (its partitions and end offsets)."""

    def __init__(self, plan: RangePlan, latest: Offsets) -> None:
        super().__init__(plan)
        self.latest = latest

    def _partitions(self, fresh: bool = False) -> dict[str, list[int]]:
        return {t: sorted(ps) for t, ps in self.latest.items()}

    def _list(self, parts: dict[str, list[int]], spec: OffsetSpec) -> Offsets:
        earliest = spec == OffsetSpec.earliest()
        return {t: {p: 0 if earliest else self.latest[t][p] for p in ps} for t, ps in parts.items()}


def test_the_start_asked_after_the_first_batch_was_planned_does_not_plan_it_again() -> None:
    # Spark plans the first batch (latestOffset) and only then asks for its start (initialOffset).
    source = _Broker(
        RangePlan(client={}, topics=["a", "b"], starting={}, max_offsets_per_trigger=1_000, chunk=1_000),
        latest={"a": {0: 5_000}, "b": {0: 5_000}},
    )
    first = offsets_from_json(source.latestOffset())
    start = offsets_from_json(source.initialOffset())
    second = offsets_from_json(source.latestOffset())
    assert start == {"a": {0: 0}, "b": {0: 0}}
    assert first == {"a": {0: 1_000}, "b": {0: 0}}
    # the next batch goes on from the first one's end: every offset planned once
    assert second == {"a": {0: 1_000}, "b": {0: 1_000}}


def test_the_partitions_of_one_busy_topic_stay_level_when_read_in_chunks() -> None:
    end = cap({"t": {0: 0, 1: 0}}, {"t": {0: 100_000, 1: 100_000}}, 20_000, chunk=2_000)
    assert end == {"t": {0: 10_000, 1: 10_000}}


def test_every_plan_moves_forward_within_the_budget_and_serves_every_partition() -> None:
    """Random backlogs, records arriving between batches, partitions appearing, targets (``until``):
    every plan ends between its start and the partition's end, holds at most the budget (in chunks;
    shared in proportion, one offset per partition behind at least), and a partition with records
    to read is served within a bounded number of batches."""
    rng = random.Random(11)
    for _ in range(300):
        budget, chunk = rng.randint(1, 5_000), rng.choice([None, rng.randint(1, 2_000)])
        latest: Offsets = {
            f"t{i}": {p: rng.randint(0, 20_000) for p in range(rng.randint(1, 3))} for i in range(8)
        }
        start: Offsets = {t: {p: rng.randint(0, o) for p, o in ps.items()} for t, ps in latest.items()}
        waited: dict[tuple[str, int], int] = {}
        for _ in range(40):
            end = cap(start, latest, budget, chunk, waited)
            moved = behind = 0
            for t, ps in latest.items():
                for p, o in ps.items():
                    s = start.get(t, {}).get(p, o)
                    assert s <= end[t][p] <= max(s, o), (t, p, s, end[t][p], o)
                    moved += end[t][p] - s
                    behind += o > s
            # shared in proportion, a partition behind gets at least one offset, even past the budget
            assert moved <= (budget if chunk else max(budget, behind))
            waited = waits(start, latest, end, waited)
            assert max(waited.values(), default=0) <= 2 * len(waited) + 2
            start = {t: {**start.get(t, {}), **ps} for t, ps in end.items()}
            for ps in latest.values():  # records arrive; now and then a partition is born
                for p in ps:
                    ps[p] += rng.choice([0, 0, rng.randint(1, 500)])
            if rng.random() < 0.1:
                latest[f"t{len(latest)}"] = {0: rng.randint(1, 3_000)}


class _Described:
    """A describe_topics future: the topic's partitions, or the broker's unknown-topic error."""

    def __init__(self, partitions: list[int] | None) -> None:
        self.partitions = partitions

    def result(self, timeout: float) -> Any:
        if self.partitions is None:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return SimpleNamespace(partitions=[SimpleNamespace(id=p) for p in self.partitions])


class _Cluster:
    """An admin client's metadata answers: every topic and its partitions (list_topics), or the topics
    named (describe_topics); how often it was asked, and what was named."""

    def __init__(self, topics: dict[str, list[int]]) -> None:
        self.topics = topics
        self.asked = 0
        self.described: list[list[str]] = []

    def list_topics(self, timeout: float) -> Any:
        self.asked += 1
        return SimpleNamespace(
            topics={
                t: SimpleNamespace(partitions=dict.fromkeys(ps), error=None) for t, ps in self.topics.items()
            }
        )

    def describe_topics(self, topics: TopicCollection, request_timeout: float) -> dict[str, _Described]:
        self.asked += 1
        self.described.append(list(topics.topic_names))
        return {t: _Described(self.topics.get(t)) for t in topics.topic_names}


class _Listed(RangeReader):
    """The source with the cluster's metadata given, and end offsets that fail as librdkafka's do for a
    deleted topic's partition (no leader), or with ``failure`` for every topic."""

    def __init__(self, plan: RangePlan, cluster: _Cluster) -> None:
        super().__init__(plan)
        self.cluster = cluster
        self.failure: KafkaError | None = None

    def _client(self) -> Any:
        return self.cluster

    def _list(self, parts: dict[str, list[int]], spec: OffsetSpec) -> Offsets:
        if self.failure is not None:
            raise KafkaException(self.failure)
        if set(parts) - set(self.cluster.topics):
            raise KafkaException(KafkaError(KafkaError._NOENT, "Failed to query partition leaders"))
        return {t: {p: 0 if spec == OffsetSpec.earliest() else 100 for p in ps} for t, ps in parts.items()}


def _listed(topics: dict[str, list[int]]) -> _Listed:
    return _Listed(RangePlan(client={}, pattern="a|b|c"), _Cluster(topics))


def test_the_partitions_are_asked_once_while_fresh_and_again_when_a_topic_listed_is_gone() -> None:
    source = _listed({"a": [0], "b": [0]})
    source.latestOffset()
    source.latestOffset()
    assert source.cluster.asked == 1  # within PARTITIONS_MAX_AGE_S: the first answer stands

    del source.cluster.topics["b"]
    end = offsets_from_json(source.latestOffset())
    assert source.cluster.asked == 2  # the end offsets of "b" failed: asked again
    assert end["a"] == {0: 100}


def test_a_topic_created_is_planned_once_the_partitions_known_are_older_than_their_max_age(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1_000.0]
    monkeypatch.setattr(ranges.time, "monotonic", lambda: now[0])
    source = _listed({"a": [0]})
    source.latestOffset()
    source.cluster.topics["c"] = [0, 1]
    assert "c" not in offsets_from_json(source.latestOffset())

    now[0] += ranges.PARTITIONS_MAX_AGE_S
    assert offsets_from_json(source.latestOffset())["c"] == {0: 100, 1: 100}
    assert source.cluster.asked == 2


def test_a_source_of_named_topics_asks_for_those_only_and_drops_one_that_is_gone() -> None:
    """Not the whole cluster's metadata (thousands of topics on a shared cluster) every few seconds,
    but the topics listed, in one request; one deleted meanwhile is answered as unknown (not created:
    NO_AUTO_CREATE) and planned no further."""
    source = _Listed(RangePlan(client={}, topics=["a", "b"]), _Cluster({"a": [0], "b": [0, 1], "z": [0]}))
    assert offsets_from_json(source.latestOffset()) == {"a": {0: 100}, "b": {0: 100, 1: 100}}
    assert source.cluster.described == [["a", "b"]]

    del source.cluster.topics["b"]
    end = offsets_from_json(source.latestOffset())
    assert source.cluster.described == [["a", "b"]] * 2  # the end offsets of "b" failed: asked again
    assert end["a"] == {0: 100} and "b" not in source._partitions()


def test_a_failure_other_than_a_gone_topic_is_not_asked_again() -> None:
    source = _listed({"a": [0]})
    source.latestOffset()
    source.failure = KafkaError(KafkaError._TIMED_OUT, "timed out")
    with pytest.raises(KafkaException, match="timed out"):
        source.latestOffset()
    assert source.cluster.asked == 1


class _Silent:
    """A describe_topics answer from a cluster that never answers: the future's wait runs out."""

    def describe_topics(self, topics: TopicCollection, request_timeout: float) -> dict[str, Any]:
        class Unanswered:
            def result(self, timeout: float) -> Any:
                raise TimeoutError

        return {t: Unanswered() for t in topics.topic_names}


def test_a_cluster_that_never_answers_a_describe_is_named_as_not_answering() -> None:
    """The future's own timeout (not a KafkaException) becomes one, so every caller's single handler
    names Kafka: here `icesink run`'s start-up refusal and the stream source's error."""
    with pytest.raises(KafkaException) as raised:
        metadata.partitions(_Silent(), ["a"], 0.1)
    assert raised.value.args[0].code() == KafkaError._TIMED_OUT
    assert "'a'" in str(raised.value)
