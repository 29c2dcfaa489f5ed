"""The Arrow decoder never disagrees with Spark's: it declines, or it decodes exactly the same values.

Spark's decoder (service.data.spark_decode) is the reference: it names what is wrong with a record and
dead-letters it. The Arrow decoder (service.data.arrow_decode) may only take a record that Spark's
decoder accepts, and must then produce the same value in every column. Each record of a corpus of
good records and edge cases (every encoding's boundaries, malformed envelopes and keys) is decoded by
both; the corpus is decoded by Spark in one job and by the Arrow decoder one record at a time.
Both also keep the same last change per key from changes spread over partitions.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.types import StringType
from pyspark.sql import SparkSession

from service.data.arrow_decode import Declined, decode, latest_per_key, unsupported
from service.data.envelope import ERROR_COLUMN, KAFKA_POSITION, record_field
from service.data.spark_decode import decode as spark_decode
from service.data.spark_decode import decoding as spark_decoding
from service.data.spark_decode import latest_per_key as spark_latest_per_key
from service.model.columns import Column, Encoding, column_from_config, list_of
from tests.sink.decoders import comparable, kafka_positions, normalise, value_columns
from tests.sink.decoders import spark_decoded as decode_with_spark

COLUMNS: list[Column] = [
    column_from_config(name, type_text, required, encoding)
    for name, type_text, required, encoding in [
        ("id", "long", True, None),
        ("i32", "int", False, None),
        ("f32", "float", False, None),
        ("f64", "double", False, None),
        ("flag", "boolean", False, None),
        ("s", "string", False, None),
        ("req", "string", True, None),
        ("raw", "binary", False, None),
        ("fx", "fixed[4]", False, None),
        ("dec", "decimal(12,3)", False, None),
        ("big", "decimal(30,5)", False, None),
        ("dtext", "decimal(10,3)", False, "decimal-text"),
        ("d", "date", False, None),
        ("t_ms", "time", False, "io.debezium.time.Time"),
        ("t_us", "time", False, "io.debezium.time.MicroTime"),
        ("t_ns", "time", False, "io.debezium.time.NanoTime"),
        ("ts_ms", "timestamp", False, "io.debezium.time.Timestamp"),
        ("ts_us", "timestamptz", False, "io.debezium.time.MicroTimestamp"),
        ("ts_ns", "timestamp", False, "io.debezium.time.NanoTimestamp"),
        ("tz", "timestamptz", False, "io.debezium.time.ZonedTimestamp"),
        ("u", "uuid", False, None),
        ("us", "string", False, "uuid-text"),
        ("vs", "string", False, "io.debezium.data.VariableScaleDecimal"),
        ("vd", "decimal(20,4)", False, "io.debezium.data.VariableScaleDecimal"),
        ("dur", "long", False, "io.debezium.time.MicroDuration"),
        ("li", "list<int>", False, None),
        ("ldec", "list<decimal(12,3)>", False, None),
        ("lbig", "list<decimal(30,5)>", False, None),
        ("lt", "list<time>", False, "io.debezium.time.MicroTime"),
        ("ltz", "list<timestamptz>", False, "io.debezium.time.ZonedTimestamp"),
        ("lu", "list<uuid>", False, None),
        ("lvd", "list<decimal(20,4)>", False, "io.debezium.data.VariableScaleDecimal"),
    ]
] + [Column("lreq", list_of(StringType(), element_required=True), False, Encoding.STRING)]
KEY = ["id"]
MAX_BYTES = 4000


def _b64(n: int, width: int | None = None) -> str:
    size = width or max(1, (n.bit_length() + 8) // 8)
    return base64.b64encode(n.to_bytes(size, "big", signed=True)).decode()


def _good_row(rng: random.Random, key: int) -> dict[str, Any]:
    return {
        "id": key,
        "i32": rng.randint(-(2**31), 2**31 - 1),
        "f32": rng.choice([0.1, -2.5, 3.4e38, 1e-40, 123456.789, 7, "NaN", "Infinity", "-Infinity"]),
        "f64": rng.choice([rng.uniform(-1e300, 1e300), "NaN", "-Infinity"]),
        "flag": rng.random() < 0.5,
        "s": rng.choice(["héllo", "", 'a"quote', "tab\t", "é\U0001f600"]),
        "req": "x",
        "raw": base64.b64encode(rng.randbytes(rng.randint(1, 9))).decode(),
        "fx": base64.b64encode(rng.randbytes(4)).decode(),
        "dec": _b64(rng.randint(-(10**12) + 1, 10**12 - 1)),
        "big": _b64(rng.randint(-(10**30) + 1, 10**30 - 1)),
        # Exact at scale 3 (trailing zeros beyond it are still exact): more digits would be rounded.
        "dtext": format(Decimal(rng.randint(-(10**10) + 1, 10**10 - 1)).scaleb(-3), "f")
        + rng.choice(["", "0", "000"]),
        "d": rng.randint(-800_000, 2_900_000),
        "t_ms": rng.randint(0, 86_399_999),
        "t_us": rng.randint(0, 86_399_999_999),
        "t_ns": rng.randint(0, 86_399_999_999_999),
        "ts_ms": rng.randint(-(2**41), 2**41),
        "ts_us": rng.randint(-(2**52), 2**52),
        "ts_ns": rng.randint(-(2**62), 2**62),
        "tz": rng.choice(
            ["2024-02-29T23:59:58.5+02:00", "1969-12-31T23:59:59.999999Z", "2026-11-22T08:00:00-07:30"]
        ),
        "u": "6F9619FF-8B86-D011-B42D-00C04FC964FF",
        "us": "6f9619ff-8b86-d011-b42d-00c04fc964ff",
        "vs": {"scale": rng.randint(0, 40), "value": _b64(rng.randint(-(10**40), 10**40))},
        "vd": {"scale": rng.randint(0, 4), "value": _b64(rng.randint(-(10**15), 10**15))},
        "dur": rng.randint(-(2**62), 2**62),
        **_good_lists(rng),
    }


def _good_lists(rng: random.Random) -> dict[str, Any]:
    """Lists as Debezium sends PostgreSQL arrays: NULL, empty, with NULL elements."""

    def some(element: Callable[[], Any]) -> list[Any] | None:
        shape = rng.random()
        if shape < 0.1:
            return None
        return [
            None if rng.random() < 0.2 else element() for _ in range(0 if shape < 0.2 else rng.randint(1, 4))
        ]

    return {
        "li": some(lambda: rng.randint(-(2**31), 2**31 - 1)),
        "ldec": some(lambda: _b64(rng.randint(-(10**12) + 1, 10**12 - 1))),
        "lbig": some(lambda: _b64(rng.randint(-(10**30) + 1, 10**30 - 1))),
        "lt": some(lambda: rng.randint(0, 86_399_999_999)),
        "ltz": some(lambda: rng.choice(["2024-02-29T23:59:58.5+02:00", "1969-12-31T23:59:59.999999Z"])),
        "lu": some(lambda: "6F9619FF-8B86-D011-B42D-00C04FC964FF"),
        "lvd": some(lambda: {"scale": rng.randint(0, 4), "value": _b64(rng.randint(-(10**15), 10**15))}),
        "lreq": [str(i) for i in range(rng.randint(0, 3))],
    }


# Values at and over each encoding's edges: the Arrow decoder must decline or agree.
EDGES: dict[str, list[Any]] = {
    "i32": [2**31 - 1, 2**31, -(2**31) - 1, 1.5, "7", True, None, {"a": 1}],
    "f32": [
        3.5e38,
        -3.5e38,
        1e39,
        3.4028235e38,  # what Debezium sends for the largest real: rounds to the largest float
        3.4028235677973362e38,  # the largest double that rounds to a finite float
        3.4028235677973366e38,
        1.4e-45,
        1,
        "1.0",
        "NaN",
        "Infinity",
        "-Infinity",
        "+Infinity",
        "INF",
        "nan",
        None,
    ],
    "f64": [1e308, 5e-324, 12345678901234567890, "x", "NaN", "Infinity", "-Infinity", "-NaN", None],
    "flag": ["true", 1, None],
    "s": [5, 1.5, True, {"a": 1}, [1, 2], "NaN", "-Infinity", None],
    "req": [None],
    "raw": ["", "abc", "YWJj", "YW Jj", "YWJj\n", "YWI=", "YWI", "Y===", "****", None],
    "fx": ["", "YWJj", "YWJjZA==", "YWJjZGU=", "YWJjZA", "****", None],
    "dec": [
        "",
        "AA==",
        "//8=",
        "gA==",
        _b64(10**12 - 1),
        _b64(10**12),
        _b64(-(10**12)),
        _b64(5, 9),
        _b64(-5, 12),
        "AQAAAAAAAAAAAQ==",
        "not base64",
        "AAE",
        7,
        None,
    ],
    "big": ["", _b64(10**30 - 1), _b64(10**30), _b64(-1, 20), "A=", None],
    "dtext": [
        "1.0005",
        "1.0015",
        "-1.0005",
        "-1.0015",
        "1e3",
        " 1.5",
        "+1",
        "1234567.999",
        "1234567.9995",
        "9999999.9995",
        "-9999999.9994",
        "12345678",
        ".5",
        "5.",
        "abc",
        1.5,
        7,
        "",
        "-0",
        "00012.5",
        "0.00000000000000000000000000000000049",
        "1" * 90,
        "1.5000000",
        "1.5E-2",
        "1.5E-4",
        "1.234567891E7",
        "1.2345E3",
        "1E+2",
        "1e-999",
        "1e999",
        "0E-50",
        "NAN",
        None,
    ],
    "vs": [
        {"scale": 0, "value": ""},
        {"scale": 2},
        {"value": "AQ=="},
        {"scale": -3, "value": "AQ=="},
        {"scale": 16383, "value": "AQ=="},
        {"scale": 16384, "value": "AQ=="},
        {"scale": 2**31, "value": "AQ=="},
        {"scale": 1.5, "value": "AQ=="},
        {"scale": "1", "value": "AQ=="},
        {"scale": 1, "value": "AQ"},
        {"scale": 1, "value": "AQ==", "extra": 1},
        "1.5",
        1.5,
        None,
    ],
    "vd": [
        {"scale": 5, "value": _b64(1)},
        {"scale": 5, "value": _b64(10)},
        {"scale": 8, "value": _b64(-(10**20))},
        {"scale": 0, "value": _b64(10**16)},
        {"scale": 0, "value": _b64(10**16 - 1)},
        {"scale": -2, "value": _b64(5)},
        None,
    ],
    # PostgreSQL's first and last dates, and what Debezium sends for 'infinity' and '-infinity' (its
    # stream, then its snapshot).
    "d": [
        *(2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 0, "0", None),
        *(-2_440_588, -2_440_589, 2_145_042_905, 2_145_042_906),
        *(-2_147_472_692, -2_147_472_691, -622_191_234, -625_821_272),
    ],
    "t_ms": [-1, 0, 86_399_999, 86_400_000, 2**60, None],
    "t_us": [-1, 86_399_999_999, 86_400_000_000, None],
    "t_ns": [-1, 86_399_999_999_999, 86_399_999_999_999_999, 999, None],
    # Debezium's 'infinity' and '-infinity', PostgreSQL's last timestamp (beyond int64 µs), its first.
    "ts_ms": [
        *(2**62, -(2**62), 9_223_372_036_854_775, 9_223_372_036_854_776, None),
        *(9_223_372_036_825_200, -9_223_372_036_832_400, 9_224_318_015_999_999, -210_866_803_200_000),
    ],
    "ts_us": [
        *(2**63 - 1, -(2**63), 1.5, None, 9_223_372_036_825_200_000, -9_223_372_036_832_400_000),
        *(-210_866_803_200_000_000, -210_866_803_200_000_001, -9_223_372_036_853_775_810),
    ],
    "ts_ns": [1_700_000_000_123_456_789, -1, -999, -1000, -1001, 2**63 - 1, None],
    "tz": [
        "2024-02-29T23:59:58Z",
        "2024-02-29 23:59:58Z",
        "2024-02-29T23:59:58.1234567Z",
        "2024-02-30T00:00:00Z",
        "2024-01-01T00:00:00+14:00",
        "2024-01-01T00:00:00",
        "2024-01-01T00:00:00+0200",
        "0001-01-01T00:00:00Z",
        "2024-01-01T24:00:00Z",
        "x",
        None,
        "infinity",
        "-infinity",
        "-4712-01-01T00:00:00.000000Z",
        "0000-12-31T23:59:59Z",
        "+10000-01-01T00:00:00Z",
        "10000-01-01T00:00:00Z",
        "-4713-11-24T00:00:00Z",
        "-4713-11-23T23:59:59.999999Z",
        "+294247-01-10T04:00:54.775807Z",
        "+294247-01-10T04:00:54.775808Z",
        "+294276-12-31T23:59:59.999999Z",
        "-290308-12-21T19:59:05.224192Z",
        "1000-02-29T00:00:00Z",
        "2024-01-01T00:00:00+18:00",
        "2024-01-01T00:00:00-18:30",
        "2024-01-01T00:00:00Z\n",
    ],
    "dur": [2**63 - 1, -(2**63), -(2**63) + 1, 0, None],
    "u": [
        "6f9619ff-8b86-d011-b42d-00c04fc964fg",
        "6f9619ff8b86d011b42d00c04fc964ff",
        "6f9619ff-8b86-d011-b42d-00c04fc964ff\n",
        None,
    ],
    "us": ["{6f9619ff-8b86-d011-b42d-00c04fc964ff}", None],
    "li": [[2**31 - 1, None], [1, 2**31], [-(2**31) - 1], [1.5], ["7"], [None], [], [[1]], 5, "x", {"a": 1}],
    "ldec": [[_b64(10**12 - 1)], [None, _b64(10**12)], ["not base64"], [""], [7]],
    "lbig": [[_b64(10**30 - 1), None], [_b64(10**30)], ["A="], [""]],
    "lt": [[0, 86_399_999_999], [-1], [None, 86_400_000_000]],
    "ltz": [["2024-02-30T00:00:00Z"], ["2024-02-29 23:59:58Z"], [None, "x"]],
    "lu": [["6f9619ff8b86d011b42d00c04fc964ff"], ["6f9619ff-8b86-d011-b42d-00c04fc964ff", None]],
    "lreq": [["a", None], [None], [], None],
    "lvd": [
        [{"scale": 5, "value": _b64(123456)}],
        [{"scale": 5, "value": _b64(123450)}],
        [None, {"scale": 0, "value": _b64(10**16)}],
        [{"scale": 1}],
        [{"scale": "x", "value": "AA=="}],
        [{"scale": 2, "value": "not base64"}],
        [{"scale": 2, "value": ""}],
    ],
}


def _envelope(
    op: str | None, after: dict[str, Any] | None, before: dict[str, Any] | None = None, source: Any = None
) -> dict[str, Any]:
    doc: dict[str, Any] = {"before": before, "after": after}
    if op is not None:
        doc["op"] = op
    if source is not None:
        doc["source"] = source
    return doc


def _corpus() -> list[tuple[str, bytes | None, bytes | None]]:
    """(label, key, value) records."""
    rng = random.Random(11)
    records: list[tuple[str, bytes | None, bytes | None]] = []

    def add(label: str, key: Any, value: Any, raw: bool = False) -> None:
        k = None if key is None else (key if isinstance(key, bytes) else json.dumps(key).encode())
        v = value if raw else json.dumps(value).encode()
        records.append((label, k, v))

    for i in range(40):
        row = _good_row(rng, i)
        op = rng.choice(["c", "r", "u"])
        add(f"good {op}", {"id": i}, _envelope(op, row))
        add("good delete", {"payload": {"id": i}}, {"schema": {}, "payload": _envelope("d", None, {"id": i})})
        add(
            "good with payload",
            {"schema": {"type": "struct"}, "payload": {"id": i}},
            {"schema": {"x": 1}, "payload": _envelope(op, row)},
        )
    # Timestamps of the Julian era as Debezium's PostgreSQL snapshots before 3.6 read them, in events
    # of such a snapshot (undone) and of others (kept): 1000-01-01 12:00, 4714-11-24 BC, 1582-10-14.
    julian = [
        (-30_609_748_800_000_000, "1000-01-06T12:00:00.000000Z"),
        (-210_870_086_400_000_000, "-4713-10-17T00:00:00Z"),
    ]
    julian.append((-12_219_379_200_000_000, "1582-10-14T00:00:00Z"))
    for connector, snapshot, version in [
        ("postgresql", "true", "3.4.3.Final"),
        ("postgresql", "last", "2.7.4.Final"),
        ("postgresql", "incremental", "3.6.0.Beta1"),
        ("postgresql", "true", "3.6.0.Beta2"),
        ("postgresql", "true", "3.10.0.Final"),
        ("postgresql", "false", "3.4.3.Final"),
        ("mysql", "true", "3.4.3.Final"),
        ("postgresql", None, "3.4.3.Final"),
        ("postgresql", True, "3.4.3.Final"),
    ]:
        for micros, text in julian:
            row = {
                **_good_row(rng, 4000),
                "ts_us": micros,
                "ts_ms": micros // 1000,
                "tz": text,
            }
            source = {"connector": connector, "snapshot": snapshot, "version": version, "lsn": 5}
            add(
                f"snapshot {connector} {snapshot} {version} {text}",
                {"id": 4000},
                _envelope("r", row, source=source),
            )
    for column, values in EDGES.items():
        for value in values:
            row = {**_good_row(rng, 1000), column: value}
            add(f"{column}={value!r}", {"id": 1000}, _envelope("u", row))
    good = _good_row(rng, 2000)
    add("no op", {"id": 2000}, _envelope(None, good))
    add("unknown op", {"id": 2000}, _envelope("x", good))
    add("create without after", {"id": 2000}, _envelope("c", None))
    add("delete without before", {"id": 2000}, _envelope("d", None))
    add("delete, key only in value", None, _envelope("d", None, {"id": 2000}))
    add("no key anywhere", None, _envelope("u", {**good, "id": None}))
    add("key only in value", None, _envelope("u", good))
    add("key differs from value", {"id": 2001}, _envelope("u", good))
    add("key as text", b"2000", _envelope("u", good))
    add("key of the wrong type", {"id": "2000"}, _envelope("u", good))
    add("key in upper case", {"ID": 2000}, _envelope("u", {**good, "id": None}))
    add(
        "field in upper case",
        {"id": 2000},
        _envelope("u", {**{k.upper(): v for k, v in good.items()}, "id": 2000}),
    )
    add("ts_ms of the wrong type", {"id": 2000}, {**_envelope("u", good), "ts_ms": "soon"})
    add("payload null", {"id": 2000}, {"schema": {}, "payload": None, **_envelope("u", good)})
    add("before of the wrong type", {"id": 2000}, _envelope("u", good, {"id": "x"}))
    add("after is text", {"id": 2000}, _envelope("u", "text"))  # type: ignore[arg-type]
    text = json.dumps(_envelope("u", good))
    add("not JSON", {"id": 2000}, b"{not json", raw=True)
    add("array", {"id": 2000}, b"[1, 2]", raw=True)
    add("empty value", {"id": 2000}, b"", raw=True)
    add("JSON null", {"id": 2000}, b"null", raw=True)
    add("pretty printed", {"id": 2000}, json.dumps(_envelope("u", good), indent=1).encode(), raw=True)
    add("trailing garbage", {"id": 2000}, (text + " x").encode(), raw=True)
    add("two objects", {"id": 2000}, (text + text).encode(), raw=True)
    add("duplicate op", {"id": 2000}, text.replace('"op": "u"', '"op": "u", "op": "d"').encode(), raw=True)
    add(
        "invalid UTF-8", {"id": 2000}, text.replace('"req": "x"', '"req": "\xff"').encode("latin-1"), raw=True
    )
    add("over the size limit", {"id": 2000}, _envelope("u", {**good, "s": "x" * MAX_BYTES}))
    add("tombstone", {"id": 2000}, None, raw=True)
    add("tombstone, key with schema", {"schema": {}, "payload": {"id": 2000}}, None, raw=True)
    add("tombstone without a key", None, None, raw=True)
    add("tombstone, key not JSON", b"{2000", None, raw=True)
    add("tombstone, key without the key column", {"other": 2000}, None, raw=True)
    add("tombstone, key of the wrong type", {"id": "2000"}, None, raw=True)
    # Source positions: Postgres, MySQL, and shapes that leave a change without (part of) one.
    sources: list[Any] = [
        {"lsn": 24023928, "ts_ms": 1_700_000_000_000, "txId": 7, "sequence": '["1","2"]', "db": "x"},
        {"file": "mysql-bin.000003", "pos": 154, "row": 2, "ts_ms": 1_700_000_000_000, "snapshot": "false"},
        {"ts_ms": 1_700_000_000_000},
        {"lsn": None, "file": None},
        {"lsn": "24023928"},
        {"lsn": 1.5},
        {"lsn": 2**64},
        {"lsn": -(2**63)},
        {"file": 7, "pos": "154"},
        {"row": True},
        {"ts_ms": {"a": 1}},
        "mysql",
        [1, 2],
        {},
    ]
    for source in sources:
        add(f"source {json.dumps(source)}", {"id": 3000}, _envelope("u", _good_row(rng, 3000), source=source))
        add(
            f"source in payload {json.dumps(source)}",
            {"id": 3000},
            {"schema": {}, "payload": _envelope("u", _good_row(rng, 3000), source=source)},
        )
    return records


@pytest.fixture(scope="module")
def spark_decoded(spark: SparkSession) -> dict[int, dict[str, Any]]:
    return decode_with_spark(spark, [(k, v) for _, k, v in _corpus()], COLUMNS, KEY, MAX_BYTES)


def test_julian_snapshot_timestamps_are_undone(spark_decoded: dict[int, dict[str, Any]]) -> None:
    """Debezium's PostgreSQL snapshots before 3.6 read timestamps of the Julian era in the Julian
    calendar: those events' values come back as the source holds them (1000-01-01 12:00 was sent as
    1000-01-06 12:00), every other event's stay as they are."""
    # What the snapshot sent (ZonedTimestamp text) -> (the same in microseconds, the source's value)
    cases = {
        "1000-01-06T12:00:00.000000Z": (-30_609_748_800_000_000, -30_610_180_800_000_000),  # 1000-01-01
        "-4713-10-17T00:00:00Z": (-210_870_086_400_000_000, -210_866_803_200_000_000),  # 4714-11-24 BC
        "1582-10-14T00:00:00Z": (-12_219_379_200_000_000, -12_220_243_200_000_000),  # 1582-10-04
    }
    undone = (
        "postgresql true 3.4.3.Final",
        "postgresql last 2.7.4.Final",
        "postgresql incremental 3.6.0.Beta1",
        "postgresql True 3.4.3.Final",  # early releases sent the flag as a JSON boolean
    )
    checked = 0
    for offset, (label, _, _) in enumerate(_corpus()):
        if not label.startswith("snapshot "):
            continue
        text = label.rsplit(" ", 1)[1]
        sent, source = cases[text]
        row = spark_decoded[offset]
        got = (row["ts_us"], row["ts_ms"], row["tz"])  # as microseconds (see _comparable)
        if any(label.startswith(f"snapshot {u} ") for u in undone):
            assert got == (source, source, source), (label, got, row[ERROR_COLUMN])
        elif sent < -210_866_803_200_000_000:  # before PostgreSQL's first timestamp, unless undone
            assert "out of range" in row[ERROR_COLUMN], (label, row[ERROR_COLUMN])
        else:
            assert got == (sent, sent, sent), (label, got, row[ERROR_COLUMN])
        checked += 1
    assert checked == 27


def test_a_later_batch_of_the_same_table_reuses_its_decoding_and_decodes_alike(
    spark: SparkSession, spark_decoded: dict[int, dict[str, Any]]
) -> None:
    """Spark's decoder builds a table's expressions once per application (they take thousands of
    calls into the JVM): a later batch of the same columns, here every third record of the corpus in
    reverse, reuses them (Python UDFs included) and decodes each record as the first batch did."""
    corpus = _corpus()
    picked = list(range(len(corpus)))[::-3]
    before = spark_decoding.cache_info()
    again = decode_with_spark(spark, [corpus[i][1:] for i in picked], COLUMNS, KEY, MAX_BYTES)
    after = spark_decoding.cache_info()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses), (before, after)
    differing = [
        f"{corpus[first][0]}: {name} {row[name]!r} against {spark_decoded[first][name]!r}"
        for offset, row in again.items()
        for first in [picked[offset]]
        for name in [ERROR_COLUMN, *value_columns(COLUMNS)]
        if normalise(row[name]) != normalise(spark_decoded[first][name])
    ]
    assert len(again) == len(picked) and not differing, differing


def test_every_column_has_an_arrow_decoder() -> None:
    assert unsupported(COLUMNS) is None


def test_arrow_decoder_declines_or_agrees_with_spark(spark_decoded: dict[int, dict[str, Any]]) -> None:
    corpus = _corpus()
    accepted, declined, disagreements = [], [], []
    for offset, (label, key, value) in enumerate(corpus):
        reference = spark_decoded.get(offset)
        if value is not None and len(value) > MAX_BYTES:
            declined.append(label)  # the batch task declines these before decoding (arrow_job)
            assert reference is not None and reference[ERROR_COLUMN], label
            continue
        try:
            got = comparable(decode([value], [key], kafka_positions([offset]), COLUMNS, KEY).rows)[0]
        except Declined:
            declined.append(label)
            continue
        accepted.append(label)
        assert reference is not None
        if reference[ERROR_COLUMN] is not None:
            disagreements.append(
                f"{label}: Spark dead-letters it ({reference[ERROR_COLUMN]}), Arrow accepted {got}"
            )
            continue
        for name in value_columns(COLUMNS):
            if normalise(got[name]) != normalise(reference[name]):
                disagreements.append(
                    f"{label}: column {name}: Arrow {got[name]!r}, Spark {reference[name]!r}"
                )
    assert not disagreements, "\n".join(disagreements)
    source_letters = [
        f"{label}: {spark_decoded[offset][ERROR_COLUMN]}"
        for offset, (label, _, _) in enumerate(corpus)
        if label.startswith("source") and spark_decoded[offset][ERROR_COLUMN]
    ]
    assert not source_letters, f"a source section made a dead letter: {source_letters}"
    good = [label for label in accepted if label.startswith("good")]
    assert len(good) == 120, f"good records declined: {[x for x in declined if x.startswith('good')]}"
    # The edges the Arrow decoder takes are part of the proof; print them for the record.
    print(
        f"accepted {len(accepted)} records ({len(accepted) - len(good)} edge cases), declined {len(declined)}"
    )


# (id, topic, partition, offset, op or None for a tombstone, source position): changes of a key in
# one batch, and the (topic, partition, offset) of the change both decoders must keep.
ORDER_CASES: list[
    tuple[str, list[tuple[int, str, int, int, str | None, dict[str, Any] | None]], tuple[str, int, int]]
] = [
    (
        "Postgres lsn across partitions, the newer change at the lower offset",
        [(1, "t", 0, 5, "u", {"lsn": 100, "ts_ms": 2}), (1, "t", 1, 0, "u", {"lsn": 200, "ts_ms": 3})],
        ("t", 1, 0),
    ),
    (
        "MySQL binlog rolled over: a newer file, a lower pos",
        [
            (2, "t", 0, 6, "u", {"file": "mysql-bin.000003", "pos": 9000, "row": 0, "ts_ms": 2}),
            (2, "t", 1, 1, "u", {"file": "mysql-bin.000004", "pos": 4, "row": 0, "ts_ms": 3}),
        ],
        ("t", 1, 1),
    ),
    (
        "MySQL rows of one binlog event",
        [
            (3, "t", 0, 7, "u", {"file": "mysql-bin.000004", "pos": 100, "row": 1, "ts_ms": 3}),
            (3, "t", 1, 2, "u", {"file": "mysql-bin.000004", "pos": 100, "row": 0, "ts_ms": 3}),
        ],
        ("t", 0, 7),
    ),
    (
        "commit time only",
        [(4, "t", 0, 8, "u", {"ts_ms": 1000}), (4, "t", 1, 3, "u", {"ts_ms": 2000})],
        ("t", 1, 3),
    ),
    (
        "a replay within one partition: an older position at a higher offset",
        [(5, "t", 0, 10, "u", {"lsn": 300}), (5, "t", 0, 11, "u", {"lsn": 250})],
        ("t", 0, 10),
    ),
    (
        "no positions, one partition: offsets",
        [(6, "t", 0, 12, "u", None), (6, "t", 0, 13, "u", None)],
        ("t", 0, 13),
    ),
    (
        "a tombstone follows its delete, which is newer than the other partition's change",
        [(7, "t", 1, 20, "u", {"lsn": 100}), (7, "t", 0, 14, "d", {"lsn": 400}), (7, "t", 0, 15, None, None)],
        ("t", 0, 15),
    ),
    (
        "a re-insert after a tombstone in its partition",
        [(8, "t", 0, 16, None, None), (8, "t", 0, 17, "c", {"lsn": 500})],
        ("t", 0, 17),
    ),
    (
        "a tombstone alone in its partition ranks below a change with a position",
        [(9, "t", 0, 18, None, None), (9, "t", 1, 6, "u", {"lsn": 50})],
        ("t", 1, 6),
    ),
    (
        "an event without a source takes its predecessor's position",
        [
            (10, "t", 0, 19, "u", {"lsn": 600}),
            (10, "t", 0, 20, "u", None),
            (10, "t", 1, 7, "u", {"lsn": 550}),
        ],
        ("t", 0, 20),
    ),
    (
        "two topics",
        [(11, "t", 0, 21, "u", {"lsn": 650}), (11, "t2", 0, 0, "u", {"lsn": 700})],
        ("t2", 0, 0),
    ),
    (
        "a full tie across partitions: offset, then topic and partition",
        [(12, "t", 0, 22, "u", {"lsn": 800}), (12, "t", 1, 8, "u", {"lsn": 800})],
        ("t", 0, 22),
    ),
]


def _order_records() -> list[tuple[bytes, bytes | None, str, int, int]]:
    """(key, value, topic, partition, offset) of every change of ORDER_CASES."""
    rng = random.Random(4)
    records = []
    for _, changes, _ in ORDER_CASES:
        for key, topic, partition, offset, op, source in changes:
            row = _good_row(rng, key)
            envelope = _envelope(op, None if op == "d" else row, {"id": key} if op == "d" else None, source)
            value = None if op is None else json.dumps(envelope).encode()
            records.append((json.dumps({"id": key}).encode(), value, topic, partition, offset))
    return records


def test_both_decoders_keep_the_newest_change_by_source_position(spark: SparkSession) -> None:
    records = _order_records()
    expected = {changes[0][0]: winner for _, changes, winner in ORDER_CASES}

    frame = spark.createDataFrame(
        [(k, v, t, p, o, datetime.now(UTC)) for k, v, t, p, o in records],
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp",
    )
    changes = spark_decode(frame, COLUMNS, KEY, MAX_BYTES, tombstones=True)
    assert changes.where(f"{ERROR_COLUMN} IS NOT NULL").count() == 0
    record_only = [record_field(name) for name in ("key", "value", "timestamp")]
    latest = spark_latest_per_key(changes.drop(ERROR_COLUMN, *record_only), KEY)
    kept = latest.select("id", *KAFKA_POSITION).collect()  # dates may be before year 1
    by_spark = {r["id"]: tuple(r[c] for c in KAFKA_POSITION) for r in kept}

    kafka = pa.table(
        {
            "topic": [t for _, _, t, _, _ in records],
            "partition": pa.array([p for _, _, _, p, _ in records], pa.int32()),
            "offset": pa.array([o for *_, o in records], pa.int64()),
        }
    )
    decoded = decode([v for _, v, *_ in records], [k for k, *_ in records], kafka, COLUMNS, KEY).rows
    by_arrow = {
        r["id"]: tuple(r[c] for c in KAFKA_POSITION)
        for r in latest_per_key(decoded, KEY).select(["id", *KAFKA_POSITION]).to_pylist()
    }

    labels = {changes[0][0]: label for label, changes, _ in ORDER_CASES}
    wrong = [
        f"{labels[k]}: expected {want}, Spark kept {by_spark.get(k)}, Arrow kept {by_arrow.get(k)}"
        for k, want in expected.items()
        if by_spark.get(k) != want or by_arrow.get(k) != want
    ]
    assert not wrong, "\n".join(wrong)
    assert len(by_spark) == len(by_arrow) == len(expected)


def test_a_batch_with_one_bad_record_is_declined() -> None:
    rng = random.Random(3)
    values = [json.dumps(_envelope("c", _good_row(rng, i))).encode() for i in range(50)]
    keys: list[bytes | None] = [json.dumps({"id": i}).encode() for i in range(50)]
    offsets = kafka_positions(list(range(50)))
    assert decode(values, keys, offsets, COLUMNS, KEY).records == 50
    values[37] = json.dumps(_envelope("c", {**_good_row(rng, 37), "i32": 2**40})).encode()
    with pytest.raises(Declined, match="i32"):
        decode(values, keys, offsets, COLUMNS, KEY)


def test_schema_sections_are_cut_out_and_handed_back() -> None:
    rng = random.Random(5)
    spaced = {"separators": (", ", ": ")}  # json.dumps' default; Kafka Connect writes compact JSON
    schemas = [{"type": "struct", "fields": [{"field": "id", "type": "int64"}], "v": v} for v in (1, 2)]
    rows = [_good_row(rng, i) for i in range(6)]
    values = [
        json.dumps({"schema": schemas[i % 2], "payload": _envelope("c", row)}, **spaced).encode()  # type: ignore[arg-type]
        for i, row in enumerate(rows)
    ]
    keys: list[bytes | None] = [json.dumps({"id": i}).encode() for i in range(6)]
    offsets = kafka_positions(list(range(6)))
    with_sections = decode(values, keys, offsets, COLUMNS, KEY, schema_sections=True)
    plain = [json.dumps(_envelope("c", row)).encode() for row in rows]
    without = decode(plain, keys, offsets, COLUMNS, KEY).rows
    assert with_sections.rows.schema == without.schema

    def row_values(rows: pa.Table) -> list[list[Any]]:  # NaN equals nothing: compared normalised
        return [[normalise(v) for v in row.values()] for row in comparable(rows)]

    assert row_values(with_sections.rows) == row_values(without)
    assert [json.loads(t)["v"] for t in with_sections.schemas] == [1, 2]


def test_a_schema_section_that_hides_the_payload_marker_is_declined() -> None:
    """The section is cut at the first `,"payload":` (never inside a string, where quotes are
    escaped); a key "payload" inside the section leaves a cut that is not JSON on its own."""
    row = _good_row(random.Random(1), 1)
    schema = {"type": "struct", "parameters": {"x": 1, "payload": 2}, "fields": []}
    value = json.dumps({"schema": schema, "payload": _envelope("c", row)}, separators=(",", ":")).encode()
    with pytest.raises(Declined, match="schema section"):
        decode([value], [b'{"id":1}'], kafka_positions([0]), COLUMNS, KEY, schema_sections=True)


def test_a_task_over_its_memory_bound_declines() -> None:
    """A huge batch (a backlog without kafka.max_offsets_per_trigger) goes to Spark's path, which spills."""
    from typing import cast

    from service.data.arrow_job import ArrowTaskSpec, process_partition
    from service.data.files import WriteSpec

    rng = random.Random(9)
    values = [json.dumps(_envelope("c", _good_row(rng, i))).encode() for i in range(100)]
    batch = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([json.dumps({"id": i}).encode() for i in range(100)], pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array(["t"] * 100),
            "partition": pa.array([0] * 100, pa.int32()),
            "offset": pa.array(range(100), pa.int64()),
            "timestamp": pa.array([0] * 100, pa.timestamp("us", tz="UTC")),
        }
    )
    spec = ArrowTaskSpec(
        write=cast(WriteSpec, None), columns=COLUMNS, max_record_bytes=MAX_BYTES, max_task_bytes=10_000
    )
    out = pa.Table.from_batches(list(process_partition(spec, iter([batch, batch])))).to_pylist()
    assert [r["kind"] for r in out] == ["declined"]
    assert "kafka.max_offsets_per_trigger" in out[0]["text"]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_compacting_chunk_by_chunk_keeps_what_the_whole_batch_keeps(chunk: int) -> None:
    """A task that reads its range chunk by chunk keeps each key's last change as it goes
    (LatestPerKey): the same rows as compacting the whole batch at once, the cases of source order
    (a tombstone taking its predecessor's position across a chunk's edge) included."""
    from service.data.arrow_decode import LatestPerKey

    rng = random.Random(11)
    records = _order_records()
    for offset in range(40):  # more changes of a few keys, some without a source position
        key = rng.randrange(100, 104)
        source = None if rng.random() < 0.3 else {"lsn": rng.randrange(1000, 1100)}
        value = json.dumps(_envelope("u", _good_row(rng, key), None, source)).encode()
        records.append((json.dumps({"id": key}).encode(), value, "t9", 0, offset))
    records.sort(key=lambda r: (r[2], r[3], r[4]))

    def decoded(rows: list[tuple[bytes, bytes | None, str, int, int]]) -> pa.Table:
        kafka = pa.table(
            {
                "topic": [t for _, _, t, _, _ in rows],
                "partition": pa.array([p for _, _, _, p, _ in rows], pa.int32()),
                "offset": pa.array([o for *_, o in rows], pa.int64()),
            }
        )
        return decode([v for _, v, *_ in rows], [k for k, *_ in rows], kafka, COLUMNS, KEY).rows

    def kept(rows: pa.Table) -> set[tuple[Any, ...]]:
        return {tuple(r.values()) for r in rows.select(["id", *KAFKA_POSITION]).to_pylist()}

    whole = latest_per_key(decoded(records), KEY)
    latest = LatestPerKey(KEY)
    for start in range(0, len(records), chunk):
        latest.add(decoded(records[start : start + chunk]))
    assert latest.rows is not None and latest.rows.num_rows <= 2 * whole.num_rows
    assert kept(latest.result()) == kept(whole)
