"""PostgreSQL's date and time types through a real Debezium connector, value by value (docs/types.md).

One source table holds a column of each date/time type and rows across the whole range PostgreSQL
allows: 4714-11-24 BC (its minimum) and other BC values, the Julian era (1000, 1582-10-04), the
calendar change (1582-10-05..15), 1900, 0001-01-01, around the epoch, 9999/10000, the largest values
int64 microseconds hold, PostgreSQL's maximum date (5874897 AD), ``infinity``, NULLs. The connector
snapshots part of it and streams the rest; the sink runs in upsert mode; the table is read through
Spark and DuckDB and compared with the source, each temporal value as the integer a reader and
PostgreSQL agree on (microseconds or days since 1970-01-01, proleptic Gregorian, as all of them count)
and, where Python can hold it, as the value ``SELECT *`` returns. Values no Iceberg column can hold
(``infinity``, timestamps beyond int64 microseconds, a time of 24:00) are dead letters with a reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any, cast

import sqlalchemy as sa

from readers import duckdb_connect, duckdb_rows
from tests.cdc import CdcSource, differences, write_corpus
from tests.sink.conftest import Sink
from tests.sink.expect import topic_records

COLUMNS = ("ts", "ts_ms", "tstz", "d", "ttz", "iv")
DDL = """CREATE TABLE {table} (
    id int PRIMARY KEY,
    ts timestamp,          -- io.debezium.time.MicroTimestamp
    ts_ms timestamp(3),    -- io.debezium.time.Timestamp (milliseconds)
    tstz timestamptz,      -- io.debezium.time.ZonedTimestamp
    d date,                -- io.debezium.time.Date
    ttz timetz,            -- io.debezium.time.ZonedTime
    iv interval            -- io.debezium.time.MicroDuration (interval.handling.mode=numeric)
)"""
# Times have a table of their own: Spark can't read a table with an Iceberg `time` column at all
# (docs/configuration.md), so these are read through DuckDB alone.
TIME_COLUMNS = ("t", "t_ms")
TIMES_DDL = """CREATE TABLE {table} (
    id int PRIMARY KEY,
    t time,                -- io.debezium.time.MicroTime
    t_ms time(3)           -- io.debezium.time.Time (milliseconds)
)"""
TIMES: dict[int, dict[str, str]] = {
    1: {"t": "00:00:00", "t_ms": "00:00:00"},
    2: {"t": "23:59:59.999999", "t_ms": "23:59:59.999"},
    3: {"t": "12:34:56.123456", "t_ms": "10:00:00.5"},
    4: {},
}
DEAD_TIMES: dict[int, tuple[dict[str, str], str]] = {
    20: ({"t": "24:00:00"}, r"column t: 24:00:00 has no Iceberg time"),
    21: ({"t_ms": "24:00:00"}, r"column t_ms: 24:00:00 has no Iceberg time"),
}

# Rows every reader holds exactly: id -> the non-null columns. The initial snapshot reads these too.
ROWS: dict[int, dict[str, str]] = {
    1: {
        "ts": "1000-01-01 12:00:00.123456",
        "ts_ms": "1000-01-01 12:00:00.123",
        "tstz": "1000-01-01 12:00:00.123456+00",
        "d": "1000-01-01",
        "ttz": "12:00:00+05:30",
        "iv": "1 year 2 months 3 days 04:05:06.789",
    },
    2: {
        "ts": "1582-10-04 23:59:59.999999",  # the last day of the Julian calendar where it was adopted
        "ts_ms": "1582-10-04 23:59:59.999",
        "tstz": "1582-10-04 12:00:00+00",
        "d": "1582-10-04",
        "ttz": "23:59:59.999999-12",
        "iv": "-1 mons",
    },
    3: {
        "ts": "1582-10-15 00:00:00",
        "ts_ms": "1582-10-15 00:00:00",
        "tstz": "1582-10-15 00:00:00+00",
        "d": "1582-10-15",
        "ttz": "12:34:56.123456+14:59",
        "iv": "1 mon",
    },
    4: {
        "ts": "1900-01-01 00:00:00",
        "ts_ms": "1900-01-01 00:00:00",
        "tstz": "1900-01-01 00:00:00+00",
        "d": "1900-01-01",
        "iv": "-3 days 04:00:00",
    },
    5: {
        "ts": "4714-11-24 00:00:00 BC",  # PostgreSQL's minimum (Julian day 0)
        "ts_ms": "4714-11-24 00:00:00 BC",
        "tstz": "4714-11-24 00:00:00+00 BC",
        "iv": "100 years",
    },
    6: {
        "ts": "0001-01-01 00:00:00",
        "ts_ms": "0001-01-01 00:00:00",
        "tstz": "0001-01-01 00:00:00+00",
        "d": "0001-01-01",
    },
    7: {
        "ts": "0001-12-31 23:59:59.999999 BC",  # year 0 of ISO 8601
        "tstz": "0001-12-31 23:59:59.999999+00 BC",
        "ts_ms": "4713-01-01 00:00:00 BC",
    },
    8: {
        "ts": "1969-12-31 23:59:59.999999",
        "ts_ms": "1969-12-31 23:59:59.999",
        "tstz": "1969-12-31 23:59:59.999999+00",
        "d": "1969-12-31",
        "iv": "-00:00:00.000001",
    },
    9: {
        "ts": "2026-03-01 10:00:00.5",
        "ts_ms": "2026-03-01 10:00:00.5",
        "tstz": "2026-03-01 10:00:00.5+02",
        "d": "2026-03-01",
        "ttz": "00:00:00+00",
        "iv": "00:00:00",
    },
    10: {
        "ts": "9999-12-31 23:59:59.999999",
        "ts_ms": "9999-12-31 23:59:59.999",
        "tstz": "9999-12-31 23:59:59.999999+00",
        "d": "9999-12-31",
    },
    11: {
        "ts": "10000-01-01 00:00:00",
        "ts_ms": "10000-01-01 00:00:00",
        "tstz": "10000-01-01 00:00:00+00",
        "d": "10000-01-01",
    },
    12: {
        "ts": "294247-01-10 04:00:54.775806",  # the last microsecond every reader holds
        "ts_ms": "294247-01-10 04:00:54.775",
        "tstz": "294247-01-10 04:00:54.775806+00",
        "d": "5874897-12-31",  # PostgreSQL's maximum
    },
    13: {},  # all NULL
}
# Rows only streamed: values Debezium's initial snapshot (JDBC, java.sql.Date/Timestamp) can't carry
# (docs/types.md): BC dates, and the ten days the Julian-Gregorian switch skipped.
STREAMED_ROWS: dict[int, dict[str, str]] = {
    14: {"d": "4714-11-24 BC", "ts": "4713-01-01 00:00:00 BC"},
    15: {"d": "0001-12-31 BC"},
    16: {
        "ts": "1582-10-10 12:00:00",
        "ts_ms": "1582-10-05 00:00:00",
        "tstz": "1582-10-14 23:59:59.999999+00",
        "d": "1582-10-10",
    },
}
# Rows no Iceberg column can hold: each a dead letter whose reason matches.
DEAD: dict[int, tuple[dict[str, str], str]] = {
    20: ({"ts": "infinity"}, r"column ts: .*infinity"),
    21: ({"ts": "-infinity"}, r"column ts: .*infinity"),
    22: ({"ts_ms": "infinity"}, r"column ts_ms: .*infinity"),
    23: ({"tstz": "infinity"}, r"column tstz: .*infinity"),
    24: ({"tstz": "-infinity"}, r"column tstz: .*infinity"),
    25: ({"d": "infinity"}, r"column d: .*infinity"),
    26: ({"d": "-infinity"}, r"column d: .*infinity"),
    27: ({"ts": "294276-12-31 23:59:59.999999"}, r"column ts: .*range"),
    28: ({"ts_ms": "294276-12-31 23:59:59.999"}, r"column ts_ms: .*range"),
    29: ({"tstz": "294276-12-31 23:59:59.999999+00"}, r"column tstz: .*range"),
    31: ({"iv": "178000000 years"}, r"column iv: .*interval"),
}
STREAMED = 100  # a streamed copy of row n has id n + STREAMED
# The dead letters' reasons, as the corpus files of these captures expect them.
TEMPORAL_LETTERS = [
    "'infinity'",
    "is out of range for",
    "is outside PostgreSQL's dates",
    "MicroDuration saturated",
]
TIME_LETTERS = ["24:00:00 has no Iceberg time"]


def _insert(
    table: str, rows: dict[int, dict[str, str]], offset: int = 0, columns: tuple[str, ...] = COLUMNS
) -> str:
    """One INSERT of `rows` (literals cast to the column's type by PostgreSQL)."""
    values = []
    for key, row in rows.items():
        literals = [f"'{row[c]}'" if c in row else "NULL" for c in columns]
        values.append(f"({key + offset}, {', '.join(literals)})")
    return f"INSERT INTO {table} (id, {', '.join(columns)}) VALUES {', '.join(values)}"


# Each temporal value as an integer: microseconds (timestamps, times) or days (dates) since
# 1970-01-01 00:00 UTC; the interval as Debezium's MicroDuration computes it (a month is 30.4375 days).
# ttz as Debezium's ZonedTime text: the time of day in UTC.
_SOURCE_SQL = """SELECT id,
    (extract(epoch FROM ts) * 1000000)::numeric AS ts,
    (extract(epoch FROM ts_ms) * 1000000)::numeric AS ts_ms,
    (extract(epoch FROM tstz) * 1000000)::numeric AS tstz,
    d - date '1970-01-01' AS d,
    ((ttz AT TIME ZONE 'UTC')::time)::text || 'Z' AS ttz,
    (((extract(year FROM iv) * 12 + extract(month FROM iv)) * 30.4375 + extract(day FROM iv)) * 86400000000
      + extract(hour FROM iv) * 3600000000 + extract(minute FROM iv) * 60000000
      + extract(second FROM iv) * 1000000)::numeric AS iv
FROM {table} WHERE NOT (id = ANY(:dead))"""
_SPARK_SQL = """SELECT id, unix_micros(CAST(ts AS TIMESTAMP)) AS ts, unix_micros(CAST(ts_ms AS TIMESTAMP)) AS ts_ms,
    unix_micros(tstz) AS tstz, unix_date(d) AS d, ttz, iv FROM {table}"""
_DUCKDB_SQL = """SELECT id, epoch_us(ts) AS ts, epoch_us(ts_ms) AS ts_ms, epoch_us(tstz) AS tstz,
    datediff('day', DATE '1970-01-01', d) AS d, ttz, iv FROM {table}"""


def _as_int(value: Any) -> Any:
    return int(value) if isinstance(value, Decimal) else value


def _source_integers(cdc: CdcSource, table: str) -> list[dict[str, Any]]:
    dead = [k + o for k in DEAD for o in (0, STREAMED)]
    with cdc.engine.begin() as conn:
        result = conn.execute(sa.text(_SOURCE_SQL.format(table=table)), {"dead": dead})
        return [{c: _as_int(v) for c, v in row._mapping.items()} for row in result]


def _spark(spark: Any, sql: str, identifier: str) -> list[dict[str, Any]]:
    table = ".".join(f"`{p}`" for p in ["rest", *identifier.split(".")])
    return [row.asDict() for row in spark.sql(sql.format(table=table)).collect()]


def _duckdb_integers(identifier: str) -> list[dict[str, Any]]:
    con = duckdb_connect()
    try:
        table = ".".join(f'"{p}"' for p in ["cat", *identifier.split(".")])
        cursor = con.execute(_DUCKDB_SQL.format(table=table))
        names = [d[0] for d in cursor.description or []]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    finally:
        con.close()


def _letters(sink: Sink, dead: dict[int, tuple[dict[str, str], str]]) -> list[str]:
    """What is wrong with the sink's dead letters: each row of `dead`, snapshot and streamed, once,
    with a reason that matches."""
    expected = sorted(k + o for k in dead for o in (0, STREAMED))
    letters = topic_records(sink.bootstrap, f"{sink.name}.dlq", len(expected))
    reasons = {
        json.loads(cast(bytes, m.key()))["payload"]["id"]: dict(m.headers() or [])["icesink.error"].decode()
        for m in letters
    }
    problems = [] if sorted(reasons) == expected else [f"{sink.table}: dead letters {sorted(reasons)}"]
    return problems + [
        f"{sink.table}: id {k}: reason {r!r}"
        for k, r in reasons.items()
        if not re.search(dead[k % STREAMED][1], r)
    ]


def test_pg_dates_and_times_land_as_the_source_holds_them(
    cdc: CdcSource, make_sink: Callable[..., Sink], spark: Any, unique_name: Callable[[str], str]
) -> None:
    """Snapshot and streamed rows of every date/time type, BC to 294247 AD, land equal to the source
    through Spark and DuckDB; ``infinity`` and values beyond what Iceberg holds are dead letters."""
    table, times = f"public.{unique_name('temporal')}", f"public.{unique_name('times')}"
    dead = {k: row for k, (row, _) in DEAD.items()}
    dead_times = {k: row for k, (row, _) in DEAD_TIMES.items()}
    cdc.execute(
        DDL.format(table=table),
        _insert(table, ROWS),
        _insert(table, dead),
        TIMES_DDL.format(table=times),
        _insert(times, {**TIMES, **dead_times}, columns=TIME_COLUMNS),
    )
    connector = cdc.register(unique_name("dbz"), [table, times])
    connector.wait_snapshot_done()
    for statement in (
        _insert(table, {**ROWS, **STREAMED_ROWS}, STREAMED),
        _insert(table, dead, STREAMED),
        f"UPDATE {table} SET ts = '4713-01-01 00:00:00 BC', d = '0044-03-15 BC' WHERE id = {1 + STREAMED}",
        f"UPDATE {table} SET ts = '1582-10-04 12:00:00', tstz = NULL WHERE id = 9",
        f"DELETE FROM {table} WHERE id = {8 + STREAMED}",
        _insert(times, {**TIMES, **dead_times}, STREAMED, columns=TIME_COLUMNS),
    ):
        cdc.execute(statement)
    connector.wait_for_events(table, 2 * (len(ROWS) + len(DEAD)) + len(STREAMED_ROWS) + 2 + 2)  # + tombstone
    connector.wait_for_events(times, 2 * (len(TIMES) + len(DEAD_TIMES)))
    for name, corpus, letters in (
        (table, "pg-temporal", TEMPORAL_LETTERS),
        (times, "pg-times", TIME_LETTERS),
    ):
        description = f"PostgreSQL {corpus[3:]}: schemas on, time.precision.mode=adaptive, interval numeric"
        write_corpus(corpus, description, ["id"], cdc.records(connector.topic(name)), dead_letters=letters)

    sinks = [
        make_sink(
            mode="upsert",
            kafka={"topics": [connector.topic(name)]},
            table={"identifier": f"{unique_name('ns')}.{kind}", "key": ["id"]},
        )
        for name, kind in ((table, "temporal"), (times, "times"))
    ]
    # Both sinks at once: their Spark start-ups overlap.
    runs = [sink.start("--until-caught-up") for sink in sinks]
    for run in runs:
        assert run.wait() == 0, run.log()[-6000:]
    temporal_sink, times_sink = sinks
    problems = _letters(temporal_sink, DEAD) + _letters(times_sink, DEAD_TIMES)

    source = _source_integers(cdc, table)
    assert len(source) == 2 * len(ROWS) + len(STREAMED_ROWS) - 1
    problems += differences(source, _duckdb_integers(temporal_sink.table), "id", "duckdb")
    problems += differences(source, _spark(spark, _SPARK_SQL, temporal_sink.table), "id", "spark")
    # SELECT * as Python values, for the rows Python's datetime holds (years 1..9999).
    in_python = [k + o for k in (1, 2, 3, 4, 8, 9, 10) for o in (0, STREAMED)]  # pyspark fails on 0001-01-01
    in_python = [k for k in in_python if k not in (1 + STREAMED, 8 + STREAMED)]  # changed to BC, deleted
    where = f"id IN ({', '.join(map(str, in_python))})"
    columns = ("id", "ts", "ts_ms", "tstz", "d")
    rows = cdc.query(f"SELECT {', '.join(columns)} FROM {table} WHERE {where}")
    read = [{k: r[k] for k in columns} for r in duckdb_rows(temporal_sink.table) if r["id"] in in_python]
    problems += differences(rows, read, "id", "duckdb SELECT *")
    read = _spark(spark, f"SELECT {', '.join(columns)} FROM {{table}} WHERE {where}", temporal_sink.table)
    problems += differences(rows, read, "id", "spark SELECT *")
    # Times: SELECT * through DuckDB, Python's time of day on both sides.
    live_times = f"SELECT * FROM {times} WHERE NOT (id = ANY(ARRAY{sorted(k + o for k in DEAD_TIMES for o in (0, STREAMED))}))"
    problems += differences(cdc.query(live_times), duckdb_rows(times_sink.table), "id", "duckdb")
    assert not problems, "\n".join(problems[:60])
