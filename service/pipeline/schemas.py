"""The schemas a table's events carry, followed batch by batch (service.iceberg.evolution decides)."""

from __future__ import annotations

import json
import logging

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.types import PrimitiveType
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from service.config import TableConfig
from service.data.arrow_decode import unsupported
from service.data.spark_decode import schema_text
from service.iceberg.evolution import EvolutionPolicy, apply, check, plan
from service.model.columns import (
    Column,
    Encoding,
    SchemaError,
    columns_for_table,
    columns_from_envelope_schema,
    with_encodings,
)

logger = logging.getLogger(__name__)
# The reason the Avro/Protobuf path gives after evolving a table for a batch: write the batch again.
EVOLVED = "the table evolved for the batch's new schema versions; writing the batch again"


class SchemaTracker:
    """The columns a table's events are decoded with, and the schema sections seen so far.

    Events with schema sections are watched for schema changes (``track``); configured columns are
    fixed. ``encodings`` are how the events encode each column (the newest schema version's);
    ``columns`` are the table's columns with those encodings.
    """

    def __init__(
        self,
        settings: TableConfig,
        table: Table,
        encodings: dict[str, Encoding],
        variable_scale: PrimitiveType,
        tasks_dead_letter: bool = False,
    ) -> None:
        self.settings = settings
        # Avro/Protobuf: the tasks dead-letter the records of refused schemas themselves (spec.rejected)
        self.tasks_dead_letter = tasks_dead_letter
        self.variable_scale = variable_scale
        self.track = not settings.columns
        self.encodings = dict(encodings)
        self.columns: list[Column] = columns_for_table(table.schema(), self.encodings)
        self.known: dict[str, dict[str, Encoding]] = {}  # schema text → its columns' encodings
        self.rejected: dict[str, str] = {}  # schema text → why its events are dead letters
        self.arrow_checked: set[str] = set()  # schema sections the Arrow path took (normalised)
        self._arrow_skip_reason: str | None = None

    def _columns_of(self, text: str) -> list[Column]:
        return columns_from_envelope_schema(json.loads(text), variable_scale=self.variable_scale)

    def arrow_ready(self) -> bool:
        """The Arrow path can be off for a while: a column without an Arrow conversion (added by an
        evolution), or events dead-lettered for their schema (only Spark's decoder knows which)."""
        reason = unsupported(self.columns)
        if reason is None and self.rejected and not self.tasks_dead_letter:
            reason = "events of an incompatible schema are being dead-lettered"
        if reason != self._arrow_skip_reason:
            if reason:
                logger.info("decoding batches with Spark's decoder for now: %s", reason)
            self._arrow_skip_reason = reason
        return reason is None

    def arrow_reason(self, table: Table, texts: set[str]) -> str | None:
        """Why the Arrow path can't take events with these schema sections, or None.

        A section is taken when the table needs no change for it (the tasks decoded each event with
        its own section's encodings); anything else (a new column, a widening, an incompatible
        change) is for Spark's path, whose schema step evolves the table or refuses.
        """
        policy = EvolutionPolicy(self.settings.schema_evolution)
        for text in texts - self.arrow_checked:
            try:
                evolution = plan(table.schema(), self._columns_of(text))
                check(evolution, policy, self.settings.identifier)
            except (SchemaError, ValueError):
                return "an event schema that does not fit the table"
            if evolution.changes:
                return f"an event schema that evolves the table ({evolution.describe()})"
            self.arrow_checked.add(text)
        return None

    def evolve(self, records: DataFrame, catalog: Catalog) -> dict[str, list[Column]]:
        """Evolve the table for schema versions first seen in this batch (service.iceberg.evolution).

        Returns the columns to decode each of the batch's schema versions with, for the versions that
        encode a column unlike the sink's current columns: a source column changed from DATETIME(3)
        to DATETIME(6) comes in milliseconds, then in microseconds, and a batch can hold both. The
        current encodings are those of the batch's newest version (by Kafka timestamp), which the
        next batches most likely carry.
        """
        if not self.track:
            return {}
        section = schema_text(F.col("value")).alias("section")
        newest_first = [
            r["section"]
            for r in records.select(section, "timestamp")
            .where(F.col("section").isNotNull())
            .groupBy("section")
            .agg(F.max("timestamp").alias("newest"))
            .orderBy(F.col("newest").desc())
            .collect()
        ]
        return self._evolve(newest_first, catalog)

    def adopt(self, table: Table, texts: set[str], catalog: Catalog) -> str | None:
        """The Avro and Protobuf path's check of a batch's schema sections (``check_schemas``): a section the table
        takes as it is passes; otherwise the table is evolved for the new sections now (or they are
        refused: their records become dead letters) and the reason to write the batch again is given.

        Their records carry no Kafka timestamp order here; the sections' order is that of their text,
        so where two new versions encode a column differently the current encoding may be the older
        one's until the next new version (each record is decoded with its own version's anyway)."""
        new = texts - self.arrow_checked - set(self.rejected)
        if not new or self.arrow_reason(table, new) is None:
            return None
        self._evolve(sorted(new, reverse=True), catalog)
        # The table evolved now, or the one the batch was written against was older than the catalog's
        # (evolved for these versions already): either way, write the batch again on a fresh load.
        return EVOLVED

    def _evolve(self, newest_first: list[str], catalog: Catalog) -> dict[str, list[Column]]:
        new = [t for t in newest_first if t not in self.known and t not in self.rejected]
        cfg = self.settings
        before = dict(self.encodings)
        table: Table | None = None  # loaded only when something changes
        for text in reversed(new):  # oldest first
            table = table or catalog.load_table(cfg.identifier)
            try:
                columns = self._columns_of(text)
                evolution = plan(table.schema(), columns)
                check(evolution, EvolutionPolicy(cfg.schema_evolution), cfg.identifier)
            except SchemaError as exc:
                if cfg.on_incompatible_schema != "dead_letter":
                    raise
                logger.error("events with an incompatible schema go to the dead-letter topic: %s", exc)
                self.rejected[text] = str(exc)
                continue
            table = apply(table, evolution)
            self.known[text] = {c.name: c.encoding for c in columns}
            self.encodings.update(self.known[text])
        latest = next((t for t in newest_first if t in self.known), None)
        if latest is not None:
            self.encodings.update(self.known[latest])
        if new or self.encodings != before:
            table = table or catalog.load_table(cfg.identifier)
            self.columns = columns_for_table(table.schema(), self.encodings)
            self.arrow_checked.clear()  # checked against the old table and encodings: check them again
        versions = {t: with_encodings(self.columns, self.known[t]) for t in newest_first if t in self.known}
        return {t: columns for t, columns in versions.items() if columns != self.columns}
