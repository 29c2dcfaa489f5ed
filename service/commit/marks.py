"""What a table says about the commits of a sink: its snapshot summaries and its table properties.

Every sink commit writes both in the same catalog commit as its snapshot:

* the snapshot summary carries ``icesink.sink-id``, ``icesink.epoch``, ``icesink.seq`` and
  ``icesink.offsets``; it goes away when the snapshot is expired;
* the table properties ``icesink.<sink_id>.seq``, ``icesink.<sink_id>.snapshot-id`` and
  ``icesink.<sink_id>.offsets`` name the sink's latest commit; they stay in the table's metadata
  whatever maintenance expires, so the proof that a plan landed survives its snapshot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyiceberg.table import Table

from service.commit.plan import SUMMARY_OFFSETS, SUMMARY_SEQ, SUMMARY_SINK_ID
from service.model.offsets import Offsets, offsets_from_json, offsets_to_json


def property_key(sink_id: str, name: str) -> str:
    return f"icesink.{sink_id}.{name}"


def commit_properties(sink_id: str, seq: int, snapshot_id: int, offsets: Offsets) -> dict[str, str]:
    """The table properties a sink sets in the catalog commit of its snapshot."""
    return {
        property_key(sink_id, "seq"): str(seq),
        property_key(sink_id, "snapshot-id"): str(snapshot_id),
        property_key(sink_id, "offsets"): json.dumps(offsets_to_json(offsets), separators=(",", ":")),
    }


@dataclass(frozen=True)
class Mark:
    """One commit of a sink as the table records it; ``source`` says where it was read."""

    seq: int
    snapshot_id: int | None
    offsets: Offsets
    source: str


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _offsets(text: str | None) -> Offsets:
    return offsets_from_json(json.loads(text)) if text else {}


def property_mark(table: Table, sink_id: str) -> Mark | None:
    """The sink's latest commit according to the table properties, if the sink ever set them."""
    props = table.metadata.properties
    seq = _int(props.get(property_key(sink_id, "seq")))
    if seq is None:
        return None
    return Mark(
        seq=seq,
        snapshot_id=_int(props.get(property_key(sink_id, "snapshot-id"))),
        offsets=_offsets(props.get(property_key(sink_id, "offsets"))),
        source=f"the table properties {property_key(sink_id, '*')}",
    )


def summary_marks(table: Table, sink_id: str) -> list[Mark]:
    """The sink's commits among the snapshots still in the table's metadata."""
    marks = []
    for snapshot in table.metadata.snapshots:
        summary = snapshot.summary
        if summary is None or summary.get(SUMMARY_SINK_ID) != sink_id:
            continue
        seq = _int(summary.get(SUMMARY_SEQ))
        if seq is not None:
            marks.append(
                Mark(
                    seq=seq,
                    snapshot_id=snapshot.snapshot_id,
                    offsets=_offsets(summary.get(SUMMARY_OFFSETS)),
                    source=f"the summary of snapshot {snapshot.snapshot_id}",
                )
            )
    return marks


def latest_mark(table: Table, sink_id: str) -> Mark | None:
    """The sink's commit with the highest seq the table knows of, from either record.

    The properties are the usual answer (and the one kept on a tie); summaries also cover commits made
    before the sink set properties, and a table whose properties someone removed.
    """
    marks = [m for m in [property_mark(table, sink_id)] if m is not None] + summary_marks(table, sink_id)
    return max(marks, key=lambda m: m.seq, default=None)
