"""Which table each topic lands in, and the pipeline of each table.

``table.identifier`` is one table for every topic, or a template over ``{topic}`` and the Debezium
source fields (``{source.db}``, ``{source.schema}``, ``{source.table}``). A topic is routed once, when
the sink first sees it with records: from its name, or from the source section of its first change
event. Debezium writes one topic per source table, so a topic lands in one table; a topic whose events
name another source table than its first are written to that first table (documented).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pyiceberg.catalog import Catalog

from service.config import SinkConfig, render_identifier, template_fields
from service.iceberg.tables import KnownTables
from service.metrics import SinkMetrics
from service.model.offsets import Offsets
from service.pipeline.isolation import isolates
from service.pipeline.table import TablePipeline, peek_topics

logger = logging.getLogger(__name__)


class Unroutable(RuntimeError):
    """Records of a topic whose table can't be named: its events carry no Debezium source section."""


class Routes:
    """topic → table, and table → :class:`TablePipeline`; tables are opened (created) on first sight."""

    def __init__(
        self, config: SinkConfig, catalog: Catalog, metrics: SinkMetrics, known: KnownTables
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.metrics = metrics
        self.known = known
        self.fields = template_fields(config.table.identifier)
        self.tables: dict[str, str] = {}  # topic → table identifier
        self.pipelines: dict[str, TablePipeline] = {}
        self.isolated: dict[str, str] = {}  # table → why its records go to the dead-letter topic
        self.paused: dict[str, str] = {}  # table → why its records are left in Kafka until a restart

    @property
    def many(self) -> bool:
        """Whether the identifier is a template (each topic may land in a table of its own)."""
        return bool(self.fields)

    @property
    def one_table(self) -> str | None:
        """A one-table sink's table (its plans keep that row format); None for a sink of many tables."""
        return None if self.many else self.config.table.identifier

    @property
    def recorded(self) -> dict[str, str]:
        """topic → table, as a sink of many tables' plans record it (a one-table sink records none)."""
        return dict(self.tables) if self.many else {}

    def topics_of(self, table: str) -> list[str]:
        return sorted(t for t, name in self.tables.items() if name == table)

    def add(self, topics: Iterable[str], with_records: set[str] | None = None) -> list[str]:
        """Route the topics not routed yet and open their tables; return the tables opened.

        ``with_records``: the topics known to hold records (a template's other topics are left for
        later: their tables are created from their first events); None means all of them.
        """
        new = [t for t in topics if t not in self.tables]
        found: dict[str, list[str]] = {}
        for topic in new:
            identifier = self._route(topic, with_records)
            if identifier is not None:
                found.setdefault(identifier, []).append(topic)
        opened = []
        for identifier, its_topics in sorted(found.items()):
            if identifier not in self.pipelines and not self.is_isolated(identifier):
                settings = self.config.table_settings(identifier)
                try:
                    self.pipelines[identifier] = TablePipeline.open(
                        self.config, settings, its_topics, self.catalog, self.metrics, self.known
                    )
                    opened.append(identifier)
                except Exception as exc:
                    self.isolate_or_raise(identifier, exc)
            for topic in its_topics:
                self.tables[topic] = identifier
                logger.info("topic %s lands in table %s", topic, identifier)
        return opened

    def _route(self, topic: str, with_records: set[str] | None) -> str | None:
        if not self.fields:
            return self.config.table.identifier
        if with_records is not None and topic not in with_records:
            return None  # its table is created from its first events, when they come
        values = {"topic": topic}
        if any(f.startswith("source.") for f in self.fields):
            source = peek_topics(self.config, [topic]).source
            missing = [f for f in self.fields if f.startswith("source.") and f.split(".", 1)[1] not in source]
            if missing:
                if with_records is None:
                    raise Unroutable(
                        f"topic {topic}: table.identifier {self.config.table.identifier!r} names "
                        f"{', '.join(missing)}, which its first change events do not carry (not Debezium "
                        "change events?): route it by {topic}, or leave it out of kafka.topics/topic_pattern"
                    )
                return None
            values |= {f"source.{k}": v for k, v in source.items()}
        return render_identifier(self.config.table.identifier, values)

    def isolate_or_raise(self, identifier: str, exc: Exception) -> None:
        """Isolate the table if ``exc`` is its own failure and its settings say so; else raise ``exc``."""
        if not isolates(self.config.table_settings(identifier), exc):
            raise exc
        self.isolate(identifier, exc)

    def is_isolated(self, identifier: str) -> bool:
        return identifier in self.isolated or identifier in self.paused

    def isolate(self, identifier: str, exc: BaseException) -> None:
        """From now until the sink restarts, the table's records go to the dead-letter topic
        (``on_failure: dead_letter``), or stay in Kafka behind the table's last committed offsets
        (``pause``: the job commits its topics no further, :meth:`paused_topics`)."""
        reason = f"{type(exc).__name__}: {exc}"
        action = self.config.table_settings(identifier).on_failure
        (self.paused if action == "pause" else self.isolated)[identifier] = reason
        self.pipelines.pop(identifier, None)
        self.metrics.tables_isolated.add(
            1,
            self.metrics.attrs(
                table=identifier, **{"error.type": type(exc).__name__, "icesink.on_failure": action}
            ),
        )
        if action == "pause":
            logger.error(
                "table %s paused (table.on_failure: pause): %s; its topics %s stay at the offsets of its last "
                "commit and are read again when the sink restarts, the other tables keep landing",
                identifier,
                reason,
                ", ".join(self.topics_of(identifier)) or "(none routed yet)",
            )
            return
        logger.error(
            "table %s isolated (table.on_failure: dead_letter): %s; its records go to the dead-letter topic "
            "%s until the sink restarts, the other tables keep landing",
            identifier,
            reason,
            self.config.dead_letter_topic,
        )

    def paused_topics(self) -> set[str]:
        """The topics of paused tables: their committed offsets must not move."""
        return {t for t, table in self.tables.items() if table in self.paused}

    def touched(self, end: Offsets, committed: Offsets) -> dict[str, list[str]]:
        """The tables whose topics moved past the committed offsets in a batch ending at ``end``
        (every table of a one-table sink), with their topics; topics seen for the first time are
        routed (and their tables opened) first."""
        if not self.many:
            return {t: self.topics_of(t) for t in sorted(set(self.tables.values()))}
        moved = sorted(
            topic
            for topic, parts in end.items()
            if any(o > committed.get(topic, {}).get(p, 0) for p, o in parts.items())
        )
        self.add(moved)
        out: dict[str, list[str]] = {}
        for topic in moved:
            out.setdefault(self.tables[topic], []).append(topic)
        return out
