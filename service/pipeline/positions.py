"""Every offset rule of the sink, in one place: where a partition starts, what a batch covers, what
is committed, and which topics' committed offsets stay behind.

Offsets are ``topic → partition → next offset to read`` (:mod:`service.model.offsets`). What the
sink keeps track of:

* ``committed``: the offsets of the last plan handed to the commit step, committed or being
  committed in the background (a plan that fails stops the sink, and the next start reads the
  txnlog's);
* ``read``: where the stream has read to, past ``committed`` by the batches the cadence buffers and
  the changes tables hold;
* ``starts``: topics the pattern matched while the sink ran, from where reading them began (their
  earliest offsets then), in case their table holds changes or is paused before its first commit;
* ``stream_start``: where the stream's first batch starts (``source.reader: tasks``); each later
  batch starts where Spark's offset log says the one before ended;
* ``target``: where a catch-up run (``--until-caught-up``) stops.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from service.config import KafkaConfig
from service.kafka.lookups import earliest_offsets, end_offsets
from service.kafka.reader import OffsetRange
from service.kafka.stream_source import batch_ranges
from service.model.offsets import EARLIEST, Offsets, merge_offsets, offsets_from_json

logger = logging.getLogger(__name__)

Partitions = dict[str, list[int]]


def starting_offsets(parts: Mapping[str, list[int]], committed: Offsets) -> str:
    """Spark's ``startingOffsets`` JSON: the committed offsets, and the earliest for any other partition.

    A partition without a committed offset is one added after the sink's first start (a
    ``starting_offsets: latest`` is resolved and committed for every partition before anything is
    read), so everything in it is new to the sink. Spark requires every partition of a subscribed
    topic to be listed when offsets are explicit.
    """
    spec = {
        topic: {str(p): committed.get(topic, {}).get(p, EARLIEST) for p in ps} for topic, ps in parts.items()
    }
    return json.dumps(spec)


def batch_end_offsets(checkpoint: str, batch_id: int) -> Offsets:
    """Where Spark's Kafka source ends micro-batch ``batch_id``: its entry in the checkpoint's offset log.

    Spark writes the entry before it runs the batch (``v1``, a metadata line, then one line per
    source: this query has one). The batch's records alone can't say where it ends: records of
    aborted transactions and transaction markers take offsets but are never read, so the offset
    after the last record read may fall short, and committing it would leave the sink's lag above
    zero for good and make every restart read the markers again.
    """
    lines = (Path(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
    return offsets_from_json(json.loads(lines[2]))


class Positions:
    """The sink's offsets; see the module's docstring for what each one is."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self.kafka = kafka
        self.committed: Offsets = {}
        self.read: Offsets = {}
        self.starts: Offsets = {}
        self.stream_start: Offsets = {}
        self.target: Offsets | None = None
        self.stops_at_target = False  # the run loop stops at the target (Spark's source stops itself)
        self.checkpoint: str | None = None  # Spark's throwaway checkpoint: its offset log ends the batches

    # -- start-up ------------------------------------------------------------------------------------

    def resume(self, committed: Offsets) -> None:
        """Start from the txnlog's committed offsets."""
        self.committed = dict(committed)
        self.read = dict(committed)

    def latest_to_record(self, partitions: Partitions) -> tuple[Offsets, list[str]] | None:
        """``starting_offsets: latest`` resolved for the topics the sink never read, and those topics;
        None when there is nothing to record.

        Left to Spark, "latest" is resolved again at every start for each partition without a
        committed offset, and a partition that had no record in any committed batch (a quiet one, or
        a sink killed before its first commit) would skip what was produced to it meanwhile. Recorded
        as a plan without files before anything is read, the offsets are the sink's from then on;
        partitions added to a topic later have no offset and are read from the earliest.
        """
        if self.kafka.starting_offsets != "latest":
            return None
        new = {t: ps for t, ps in partitions.items() if t not in self.committed}
        if not new:
            return None
        return merge_offsets(self.committed, end_offsets(self.kafka, new)), sorted(new)

    def spark_starting(self, partitions: Partitions) -> str:
        """Spark's Kafka source's ``startingOffsets`` (``source.reader: spark``)."""
        return starting_offsets(partitions, self.committed)

    def task_starting(self, partitions: Partitions) -> Offsets:
        """Where the range source starts (``source.reader: tasks``): the committed offsets, the
        earliest for a partition without one. Resolved here, so that the first batch's ranges start
        where the source's do."""
        unread = {t: [p for p in ps if p not in self.committed.get(t, {})] for t, ps in partitions.items()}
        earliest = earliest_offsets(self.kafka, {t: ps for t, ps in unread.items() if ps})
        self.stream_start = merge_offsets(earliest, self.committed)
        return self.stream_start

    def catch_up(self, partitions: Partitions, watched: bool) -> Offsets:
        """A catch-up run stops at what the topics hold now; ``watched``: the run loop stops there
        (the range source), rather than Spark's source by itself (``availableNow``)."""
        self.target = end_offsets(self.kafka, partitions)
        self.stops_at_target = watched
        logger.info("catching up to %s", self.target)
        return self.target

    def topics_born(self, partitions: Partitions, topics: list[str]) -> None:
        """Topics the pattern matched while the sink ran are read from their earliest offsets."""
        self.starts |= earliest_offsets(self.kafka, {t: partitions.get(t, []) for t in topics})

    # -- one batch -------------------------------------------------------------------------------------

    def batch_end(self, batch_id: int) -> Offsets:
        """Where Spark's source ends micro-batch ``batch_id`` (its offset log)."""
        assert self.checkpoint is not None, "the stream's checkpoint is set before the first batch"
        return batch_end_offsets(self.checkpoint, batch_id)

    def batch_ranges(self, batch_id: int, end: Offsets) -> list[OffsetRange]:
        """The offset ranges of micro-batch ``batch_id`` ending at ``end``: from where the batch
        before ended (the stream's start, for the first)."""
        start = self.stream_start if batch_id == 0 else self.batch_end(batch_id - 1)
        return batch_ranges(start, end, lambda born: earliest_offsets(self.kafka, born))

    def covering(self, end: Offsets) -> Offsets:
        """The sink's offsets once a batch ending at ``end`` is committed."""
        return merge_offsets(self.committed, end)

    def records_in(self, end: Offsets, topics: list[str]) -> int:
        """About how many records of ``topics`` a batch ending at ``end`` holds (markers included)."""
        return sum(
            max(0, o - self.read.get(t, {}).get(p, 0)) for t in topics for p, o in end.get(t, {}).items()
        )

    def advance(self, end: Offsets) -> None:
        """The stream has read a batch ending at ``end``."""
        self.read = merge_offsets(self.read, end)

    def kept_behind(self, offsets: Offsets, behind: set[str]) -> Offsets:
        """``offsets`` with the topics in ``behind`` (of tables holding changes, or paused) kept where
        they were committed: their records are read again after a restart."""
        if not behind:
            return offsets
        kept = {t: parts for t, parts in offsets.items() if t not in behind}
        # A topic never committed yet is recorded where the sink began reading it: left out, a restart
        # under `starting_offsets: latest` would take it to be new and skip what the sink had read.
        committed = {t: self.committed.get(t) or self.starts.get(t) for t in behind}
        return kept | {t: dict(parts) for t, parts in committed.items() if parts}

    def handed_over(self, offsets: Offsets) -> None:
        """A plan with these offsets went to the commit step."""
        self.committed = offsets

    # -- catching up -----------------------------------------------------------------------------------

    def caught_up(self) -> bool:
        """Whether a catch-up run the loop watches read every partition to its target."""
        if self.target is None or not self.stops_at_target:
            return False
        return all(
            self.read.get(t, {}).get(p, 0) >= o for t, ps in self.target.items() for p, o in ps.items()
        )

    def progress(self, offsets: Offsets) -> str | None:
        """A catch-up run's progress once ``offsets`` are committed, as a log line's words."""
        if self.target is None:
            return None
        reached = sum(o for t in offsets.values() for o in t.values())
        todo = sum(o for t in self.target.values() for o in t.values())
        return f"{min(reached, todo)} of {todo} offsets"
