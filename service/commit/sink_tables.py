"""Which tables are the sink's: its one table, or a sink of many tables' tables as its plans, its
overrides and its commits' marks say. Operator commands and maintenance work on these."""

from __future__ import annotations

from typing import Any

from service.commit.marks import latest_mark
from service.commit.plan import BatchPlan
from service.config import SinkConfig, template_fields
from txnlog import TransactionLog


def sink_tables(config: SinkConfig, catalog: Any, routes: dict[str, str]) -> list[str]:
    """The sink's tables: its one table; or, for a sink of many tables, those ``routes`` (the log's
    last plan: topic → table) name, the ``tables`` overrides, and the tables of the template's
    namespace when the template fixes it (``lake.{source.table}``: the tables in ``lake``) that hold a
    commit of this sink: other writers' tables in that namespace are not the sink's."""
    if not config.table.is_template:
        return [config.table.identifier]
    names = set(routes.values()) | set(config.tables)
    namespace, table = _split(config.table.identifier)
    fixed = bool(namespace) and not template_fields(namespace) and bool(template_fields(table))
    if fixed and catalog.namespace_exists(namespace):
        for found in (".".join(t) for t in catalog.list_tables(namespace)):
            if found not in names and latest_mark(catalog.load_table(found), config.sink_id) is not None:
                names.add(found)
    return sorted(names)


def existing_sink_tables(config: SinkConfig, catalog: Any, log: TransactionLog) -> list[str]:
    """:func:`sink_tables` with the routes of the sink's last committed plan, those the catalog has."""
    state = log.state(config.sink_id)
    payload = state.committed_payload if state else None
    routes = BatchPlan.from_payload(payload).routes if payload else {}
    return [t for t in sink_tables(config, catalog, routes) if catalog.table_exists(t)]


def _split(identifier: str) -> tuple[str, str]:
    """A template's namespace and table name: split at its last dot outside braces
    (``lake.{source.table}`` → ``lake``, ``{source.table}``)."""
    depth, cut = 0, -1
    for i, char in enumerate(identifier):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "." and depth == 0:
            cut = i
    return (identifier[:cut], identifier[cut + 1 :]) if cut >= 0 else ("", identifier)
