"""How the task reader's source shares ``kafka.max_offsets_per_trigger`` among partitions."""

from __future__ import annotations

from confluent_kafka.admin import OffsetSpec

from service.kafka.ranges import RangePlan, RangeReader, cap, waits
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

    def _partitions(self) -> dict[str, list[int]]:
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
