"""``icesink status``: the sink's txnlog row, and each of its tables with offsets, last commit, lag,
health (files, deletes, snapshots, metadata size) and last maintenance (its lease row in the txnlog).

The txnlog answers for the sink (epoch, owner, phase, the committed offsets); each table's last
commit of the sink is read from the table itself (service.commit.marks), and the lag from Kafka. A
catalog or Kafka that can't be reached leaves those fields null with the reason, never the command
failing: status is what an operator runs when something is wrong.
"""

from __future__ import annotations

from typing import Any

from service.commit.marks import latest_mark
from service.commit.plan import BatchPlan
from service.config import SinkConfig
from service.maintenance.lease import last_maintenance, lease_id
from service.model.offsets import Offsets
from service.txnlog_client import open_txnlog


def _offsets_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    return {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(offsets.items())}


def _routes(config: SinkConfig, committed: BatchPlan | None) -> dict[str, str]:
    """topic → table, as far as the sink has routed its topics."""
    if not config.table.is_template:
        topics = committed.offsets if committed else {t: {} for t in config.kafka.topics}
        return {t: config.table.identifier for t in topics}
    return dict(committed.routes) if committed else {}


def _lag(config: SinkConfig, committed: Offsets, topics: set[str]) -> tuple[dict[str, int], str | None]:
    """Records behind per topic, as the ``icesink.kafka.lag`` gauge counts them
    (:func:`service.kafka.lag.compute_lag`): from the committed offsets, or from the first record
    Kafka still holds, for a routed topic the sink never committed (a table whose changes are held,
    say) and for records retention deleted before they were read."""
    from service.kafka.lag import compute_lag
    from service.kafka.lookups import SourceError, consumer, partitions, watermarks

    try:
        parts = {t: sorted(ps) for t, ps in committed.items()}
        if never := topics - set(committed):
            try:
                known = partitions(config.kafka, timeout_s=5.0)
            except SourceError:  # a listed topic missing: the others' lag still answers
                known = {}
            parts |= {t: known[t] for t in sorted(never) if known.get(t)}
        client = consumer(config.kafka, "status")
        try:
            marks = watermarks(client, parts, timeout_s=5.0)
        finally:
            client.close()
    except Exception as exc:  # Kafka down: the rest of the status still answers
        return {}, f"{type(exc).__name__}: {exc}"
    lag: dict[str, int] = {}
    for (topic, _), behind in compute_lag(marks, committed).items():
        lag[topic] = lag.get(topic, 0) + behind
    return lag, None


def _from_tables(
    config: SinkConfig, tables: list[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], str | None]:
    """Each table's last commit of the sink and its health (service.maintenance.table_health)."""
    from service.iceberg.tables import open_catalog
    from service.maintenance.table_health import table_health

    marks: dict[str, dict[str, Any]] = {}
    health: dict[str, dict[str, Any]] = {}
    try:
        catalog = open_catalog(config)
    except Exception as exc:  # catalog down
        return marks, health, f"{type(exc).__name__}: {exc}"
    for identifier in tables:
        try:
            table = catalog.load_table(identifier)
            mark = latest_mark(table, config.sink_id)
            marks[identifier] = {"seq": mark.seq, "snapshot_id": mark.snapshot_id} if mark else {}
        except Exception as exc:  # the table dropped, or no longer readable by this user
            marks[identifier] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        try:  # reads the metadata file and manifest list: the object store, not only the catalog
            health[identifier] = table_health(table, identifier).to_json()
        except Exception as exc:
            health[identifier] = {"error": f"{type(exc).__name__}: {exc}"}
    return marks, health, None


def status(config: SinkConfig) -> dict[str, Any]:
    log = open_txnlog(config, "status")
    try:
        state = log.state(config.sink_id)
        committed = (
            BatchPlan.from_payload(state.committed_payload) if state and state.committed_payload else None
        )
        leases = {
            table: log.state(lease_id(config.sink_id, table)) for table in _routes(config, committed).values()
        }
    finally:
        log.close()
    if state is None:
        return {"sink_id": config.sink_id, "table": config.table.identifier, "state": "never started"}
    pending = BatchPlan.from_payload(state.pending) if state.pending else None
    last = committed.tables[0] if committed and committed.tables else None
    out: dict[str, Any] = {
        "sink_id": state.sink_id,
        "table": last.table if last and committed and committed.flat else config.table.identifier,
        "epoch": state.epoch,
        "owner": state.owner,
        "phase": str(state.phase),
        "seq": state.seq,
        "committed_seq": state.committed_seq,
        "committed_offsets": _offsets_json(committed.offsets) if committed else {},
        "last_snapshot_id": last.snapshot_id if last else None,
        "pending": {
            "seq": state.seq,
            "tables": [t.table for t in pending.tables if t.has_files],
            "snapshot_id": pending.tables[0].snapshot_id if pending.tables else None,
            "files": len(pending.file_paths()),
        }
        if pending
        else None,
        "updated_at": state.updated_at.isoformat(),
    }
    routes = _routes(config, committed)
    offsets = committed.offsets if committed else {}
    lag, lag_error = _lag(config, offsets, set(routes)) if offsets or routes else ({}, None)
    marks, health, catalog_error = _from_tables(config, sorted(set(routes.values())))
    out["tables"] = [
        {
            "table": table,
            "topics": sorted(t for t, r in routes.items() if r == table),
            "offsets": _offsets_json({t: offsets.get(t, {}) for t, r in routes.items() if r == table}),
            "last_commit": marks.get(table),
            "lag": sum(lag.get(t, 0) for t, r in routes.items() if r == table) if not lag_error else None,
            "health": health.get(table),
            "maintenance": last_maintenance(leases.get(table)),
        }
        for table in sorted(set(routes.values()))
    ]
    if lag_error:
        out["lag_error"] = lag_error
    if catalog_error:
        out["catalog_error"] = catalog_error
    return out
