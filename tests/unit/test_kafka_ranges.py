"""How the task reader's source shares ``kafka.max_offsets_per_trigger`` among partitions."""

from __future__ import annotations

from service.kafka.ranges import cap


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
