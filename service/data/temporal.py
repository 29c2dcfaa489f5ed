"""Dates, times, timestamps and intervals of Debezium events, the same way in both decoders.

**Calendar.** PostgreSQL, Iceberg (days and microseconds since 1970-01-01) and every reader (Spark 3+,
DuckDB, Trino) count in the proleptic Gregorian calendar: the Gregorian rules extended backwards, a year
0 (1 BC) and negative years. Debezium's encodings (``Date``: days, ``MicroTimestamp``: microseconds,
``ZonedTimestamp``: ISO 8601 text with a signed year) are proleptic too, so a date of the Julian era
lands as the same day number PostgreSQL holds: ``1000-01-01`` is day -354285 everywhere. icesink writes
its files with pyarrow, whose Parquet timestamps are INT64 microseconds; Spark's Parquet rebase settings
(``spark.sql.parquet.datetimeRebaseModeInWrite/Read``, INT96) concern Spark's own Parquet writer and
reader only, neither of which touches icesink's files or Iceberg's reads.

**Debezium's PostgreSQL snapshots.** Before 3.6.0 (dbz#1916) the connector reads ``timestamp`` and
``timestamptz`` values of its snapshots (the initial one and incremental ones) through JDBC's
``java.sql.Timestamp``, whose calendar is Julian before 1582-10-15: a value of the year 1000 arrives 5
days late, one of 4714 BC 38 days early. Streamed changes are decoded from the WAL and are exact. The
decoders turn such a snapshot value back into the source's (:func:`julian_to_gregorian`: the Julian
calendar date of the instant, read as a proleptic Gregorian date), for the events whose ``source`` says
they are a snapshot of that connector and version (:data:`JULIAN_SNAPSHOT_VERSIONS`). What the snapshot
loses can't be recovered and is documented in docs/types.md: the ten days 1582-10-05..14 (the JDBC
calendar moves them onto 10-15..24, where genuine values lie) and the era of BC dates (``java.sql.Date``
drops it: 44 BC arrives as 44 AD; AD dates arrive exact and are not touched).

**Ranges.** A timestamp is taken from 4714-11-24 BC 00:00 (PostgreSQL's minimum, Julian day 0) to
294247-01-10 04:00:54.775807 UTC (the largest int64 microsecond, Iceberg's limit); a date over
PostgreSQL's range, 4714-11-24 BC to 5874897-12-31 (Iceberg's int32 days hold it). Anything else is a
dead letter with the reason, never clamped. That covers what Debezium sends for PostgreSQL's
``infinity`` and ``-infinity`` (timestamps: PgJDBC's constants :data:`INFINITY_MICROS` and
:data:`MINUS_INFINITY_MICROS`, ``"infinity"`` as ZonedTimestamp text; dates: day numbers far outside the
range, different in snapshots and streams), timestamps after 294247 AD (Debezium's int64 overflows and
wraps to about 290308 BC), the time 24:00:00 (Iceberg's ``time`` ends at 23:59:59.999999) and
intervals that saturate Debezium's MicroDuration (±2^63-1 µs).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.types import TimestampType
from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F

from service.model.columns import Column, Encoding

MICROS_PER_DAY = 86_400_000_000
_JULIAN_DAY_0 = 2_440_588  # the Julian day number of 1970-01-01
# Days from 1 March 4801 BC (Julian) to 1970-01-01: the start of the Julian years counted from March.
_MARCH_YEARS_EPOCH = _JULIAN_DAY_0 + 32_082
FIRST_DAY = -_JULIAN_DAY_0  # 4714-11-24 BC: PostgreSQL's first date and timestamp
LAST_DAY = 2_145_042_905  # 5874897-12-31: PostgreSQL's last date
MIN_MICROS = FIRST_DAY * MICROS_PER_DAY
MAX_MICROS = 2**63 - 1  # 294247-01-10 04:00:54.775807 UTC
# What Debezium's PostgreSQL connector sends for timestamp 'infinity' / '-infinity' (PgJDBC's
# PGStatement.DATE_POSITIVE/NEGATIVE_INFINITY, in microseconds once scaled).
INFINITY_MICROS = 9_223_372_036_825_200_000
MINUS_INFINITY_MICROS = -9_223_372_036_832_400_000
GREGORIAN_START_MICROS = -12_219_292_800_000_000  # 1582-10-15 00:00 UTC: JDBC's Julian calendar ends here
# PostgreSQL's first timestamp as a Julian-calendar snapshot reads it (Julian 4714-11-24 BC): snapshot
# values from here to GREGORIAN_START_MICROS are Julian readings.
JULIAN_SNAPSHOT_MIN_MICROS = (FIRST_DAY - 38) * MICROS_PER_DAY
# Debezium releases whose PostgreSQL snapshots read timestamps in the Julian calendar: before 3.6.0,
# including 3.6.0's pre-releases up to Beta1 (the fix landed in 3.6.0.Beta2).
JULIAN_SNAPSHOT_VERSIONS = r"^(?:[0-2]|3\.[0-5]|3\.6\.0\.(?:Alpha\d*|Beta1))(?:\.|$)"
SATURATED_DURATIONS = (2**63 - 1, -(2**63))
SNAPSHOT_SOURCE_FIELDS = ("connector", "snapshot", "version")  # what says an event is such a snapshot

TEMPORAL = frozenset(
    {
        Encoding.DATE_DAYS,
        Encoding.TIME_MILLIS,
        Encoding.TIME_MICROS,
        Encoding.TIME_NANOS,
        Encoding.TIMESTAMP_MILLIS,
        Encoding.TIMESTAMP_MICROS,
        Encoding.TIMESTAMP_NANOS,
        Encoding.TIMESTAMP_ISO,
        Encoding.DURATION_MICROS,
    }
)
_TIMES = (Encoding.TIME_MILLIS, Encoding.TIME_MICROS, Encoding.TIME_NANOS)
# Elements of a list that the connector reads in the Julian calendar (see julian_list): ZonedTimestamp
# text is not among them.
_JULIAN_READ_LIST_ELEMENTS = (Encoding.TIMESTAMP_MILLIS, Encoding.TIMESTAMP_MICROS, Encoding.TIMESTAMP_NANOS)
_MILLIS = (Encoding.TIME_MILLIS, Encoding.TIMESTAMP_MILLIS)
_NANOS = (Encoding.TIME_NANOS, Encoding.TIMESTAMP_NANOS)
# ZonedTimestamp text as Debezium writes it: a year of 4 digits (a sign for 5 or more, or below 0).
ISO_TIMESTAMP = (
    r"^(-?\d{4}|[+-]\d{5,6})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$"
)
_ISO = re.compile(ISO_TIMESTAMP)
_INFINITIES = ("infinity", "-infinity")
_TIMESTAMP_RANGE = "4714-11-24 BC .. 294247-01-10T04:00:54.775807Z"
_DATE_RANGE = "4714-11-24 BC .. 5874897-12-31"


def _infinity_reason(name: str, what: str) -> str:
    return (
        f"column {name}: PostgreSQL's 'infinity' / '-infinity' ({what} as Debezium sends it) has no "
        "Iceberg value"
    )


# ---- the calendar arithmetic, on anything with floor division (Python ints, numpy arrays)


def days_from_civil(year: Any, month: Any, day: Any) -> Any:
    """Days since 1970-01-01 of a proleptic Gregorian date (year 0 is 1 BC)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
    return era * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719_468


def julian_to_gregorian(micros: Any) -> Any:
    """A timestamp read in the Julian calendar → the one whose proleptic Gregorian reading has the
    same fields (date and time of day), for values from JULIAN_SNAPSHOT_MIN_MICROS to
    GREGORIAN_START_MICROS. The Julian calendar runs ``y // 100 - y // 400 - 2`` days behind the
    Gregorian one in the year ``y`` counted from March (the Julian leap days the Gregorian calendar
    skips, from 1 March of each century year not divisible by 400); with 1461 days in every 4 Julian
    years, ``y`` is plain arithmetic on the day number."""
    days = micros // MICROS_PER_DAY
    year = (4 * (days + _MARCH_YEARS_EPOCH) + 3) // 1461 - 4800
    return micros - (year // 100 - year // 400 - 2) * MICROS_PER_DAY


def iso_micros(text: str) -> int | None:
    """ZonedTimestamp text → microseconds since 1970-01-01 UTC, or None when it is not a valid one."""
    match = _ISO.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, zone = match.group(7), match.group(8)
    if not (1 <= month <= 12 and 1 <= day <= _month_days(year, month)):
        return None
    if hour > 23 or minute > 59 or second > 59:
        return None
    offset = 0
    if zone != "Z":
        hours, minutes = int(zone[1:3]), int(zone[4:6])
        if minutes > 59 or hours * 60 + minutes > 18 * 60:  # java.time's offsets end at ±18:00
            return None
        offset = (hours * 60 + minutes) * (1 if zone[0] == "+" else -1)
    seconds = ((days_from_civil(year, month, day) * 24 + hour) * 60 + minute - offset) * 60 + second
    return seconds * 1_000_000 + (int(fraction[1:].ljust(6, "0")) if fraction else 0)


def _month_days(year: int, month: int) -> int:
    if month == 2:
        return 29 if (year % 4 == 0 and year % 100 != 0) or year % 400 == 0 else 28
    return 30 if month in (4, 6, 9, 11) else 31


# ---- Spark's decoder


def julian_list(column: Column) -> bool:
    """A list of timestamps that Debezium's PostgreSQL connector (of JULIAN_SNAPSHOT_VERSIONS) reads in
    the Julian calendar in every event, snapshot or streamed: seen with 3.4.3, a ``timestamp[]`` element
    of the year 1000 arrives 5 days late in both; a ``timestamptz[]`` element (ZonedTimestamp text)
    arrives exact in both, so its elements are never put back."""
    return column.is_list and column.encoding in _JULIAN_READ_LIST_ELEMENTS


def spark_julian_snapshot(source: SparkColumn, *, streamed_too: bool = False) -> SparkColumn:
    """True for an event (``source``: the envelope's source section as JSON text) that a Debezium
    PostgreSQL snapshot read in the Julian calendar (see the module's docstring); never null. With
    ``streamed_too``, for any event of such a connector (what :func:`julian_list` columns need)."""
    fields = F.from_json(source, ", ".join(f"{name} string" for name in SNAPSHOT_SOURCE_FIELDS))
    snapshot = fields.getField("snapshot")
    julian = (fields.getField("connector") == "postgresql") & fields.getField("version").rlike(
        JULIAN_SNAPSHOT_VERSIONS
    )
    if not streamed_too:
        julian = julian & snapshot.isNotNull() & (snapshot != "false")
    return F.coalesce(julian, F.lit(False))


def _floor_div(value: SparkColumn, divisor: int) -> SparkColumn:
    """Floor division of a long by a positive constant, exact (no doubles) and never overflowing."""
    truncated = F.call_function("div", value, F.lit(divisor))
    return truncated - F.when((value < 0) & (F.pmod(value, F.lit(divisor)) != 0), 1).otherwise(0)


def _let(value: SparkColumn, body: Callable[[SparkColumn], SparkColumn]) -> SparkColumn:
    """``body(value)`` with ``value`` computed once: a lambda's variable stands for it, so an expression
    that uses a value several times does not copy its whole tree each time (which made plans of
    megabytes that codegen gives up on)."""
    return F.element_at(F.transform(F.array(value), body), 1)


def _div(value: SparkColumn, divisor: int) -> SparkColumn:
    """Integer division (truncating: for values that are not negative)."""
    return F.call_function("div", value, F.lit(divisor))


def _spark_julian_to_gregorian(micros: SparkColumn) -> SparkColumn:
    """:func:`julian_to_gregorian` as Spark expressions."""
    days = _floor_div(micros, MICROS_PER_DAY)
    return _let(
        _div(4 * (days + _MARCH_YEARS_EPOCH) + 3, 1461) - 4800,
        lambda year: micros - (_floor_div(year, 100) - _floor_div(year, 400) - 2) * MICROS_PER_DAY,
    )


def _spark_micros(encoding: Encoding, wire: SparkColumn) -> SparkColumn:
    """The wire value in microseconds (long), null when it does not convert (overflow, bad text)."""
    if encoding in _MILLIS:
        return F.call_function("try_multiply", wire, F.lit(1000))
    if encoding in _NANOS:
        return _floor_div(wire, 1000)
    if encoding is Encoding.TIMESTAMP_ISO:
        return F.call_function("unix_micros", wire.try_cast("timestamp"))
    return wire


def _spark_infinite(encoding: Encoding, wire: SparkColumn, micros: SparkColumn) -> SparkColumn:
    if encoding is Encoding.TIMESTAMP_ISO:
        return wire.isin(*_INFINITIES)
    return micros.isin(INFINITY_MICROS, MINUS_INFINITY_MICROS)


def spark_convert(column: Column, wire: SparkColumn, julian: SparkColumn) -> SparkColumn:
    """The column's value (Spark's type for it), null when it does not fit: see :func:`spark_reason`.
    The wire value is bound once (:func:`_let`): the expression refers to it many times."""
    enc = column.encoding
    if enc is Encoding.DATE_DAYS:
        return _let(
            wire,
            lambda w: F.when(
                w.between(FIRST_DAY, LAST_DAY), F.call_function("date_from_unix_date", w.cast("int"))
            ),
        )
    if enc is Encoding.DURATION_MICROS:
        return F.when(~wire.isin(*SATURATED_DURATIONS), wire)
    if enc in _TIMES:
        return _let(_spark_micros(enc, wire), lambda m: F.when((m >= 0) & (m < MICROS_PER_DAY), m))

    def timestamp(w: SparkColumn, micros: SparkColumn) -> SparkColumn:
        in_julian_era = (micros >= JULIAN_SNAPSHOT_MIN_MICROS) & (micros < GREGORIAN_START_MICROS)
        instant = F.when(julian & in_julian_era, _spark_julian_to_gregorian(micros)).otherwise(micros)
        fits = (instant >= MIN_MICROS) & ~_spark_infinite(enc, w, micros)
        return F.when(fits, F.call_function("timestamp_micros", instant))

    value = _let(wire, lambda w: _let(_spark_micros(enc, w), lambda micros: timestamp(w, micros)))
    # The session time zone is UTC (see service.job), so the wall clock of the instant is UTC.
    return value.cast("timestamp_ntz") if isinstance(column.type, TimestampType) else value


def spark_reason(column: Column, wire: SparkColumn) -> SparkColumn:
    """Why a present value did not convert (:func:`spark_convert` gave null)."""
    enc, name = column.encoding, column.name.replace("%", "%%")  # the name goes into format strings

    def reason(w: SparkColumn) -> SparkColumn:
        def text(template: str) -> SparkColumn:
            return F.format_string(template, w.cast("string"))

        does_not_fit = text(f"column {name}: value %s does not fit type {column.type}")
        if enc is Encoding.DATE_DAYS:
            return text(
                f"column {name}: day %s is outside PostgreSQL's dates ({_DATE_RANGE}); Debezium sends "
                "the dates 'infinity' and '-infinity' so, and Iceberg has no date for them"
            )
        if enc is Encoding.DURATION_MICROS:
            return text(
                f"column {name}: interval %s µs is Debezium's MicroDuration saturated at ±2^63-1: the "
                "interval is longer than it holds (interval.handling.mode=string keeps it)"
            )
        micros = _spark_micros(enc, w)
        if enc in _TIMES:
            day_end = f"column {name}: 24:00:00 has no Iceberg time (a time of day ends at 23:59:59.999999)"
            return F.when(micros == MICROS_PER_DAY, F.lit(day_end)).otherwise(does_not_fit)
        out_of_range = text(f"column {name}: value %s is out of range for {column.type} ({_TIMESTAMP_RANGE})")
        if enc is Encoding.TIMESTAMP_ISO:
            # A year of 6 digits that Spark's cast does not take is beyond Iceberg's microseconds.
            beyond = w.rlike(r"^[+-]\d{6}-") | micros.isNotNull()
        else:
            beyond = F.lit(True)  # a number: only its range (or an overflow when scaled) can fail
        return (
            F.when(_spark_infinite(enc, w, micros), text(_infinity_reason(name, "%s")))
            .when(beyond, out_of_range)
            .otherwise(does_not_fit)
        )

    return _let(wire, reason)


# ---- the Arrow decoder


class Misfit(ValueError):
    """A value the Arrow decoder leaves to Spark's, which dead-letters it with a reason."""


def arrow_julian_snapshot(source: pa.Array, *, streamed_too: bool = False) -> np.ndarray:
    """:func:`spark_julian_snapshot` for the Arrow decoder's parsed ``source`` structs."""

    def field(name: str) -> pa.Array:
        return pc.struct_field(source, name)

    julian = reduce(
        pc.and_kleene,
        [
            pc.is_valid(source),
            pc.equal(field("connector"), "postgresql"),
            pc.match_substring_regex(field("version"), JULIAN_SNAPSHOT_VERSIONS),
            *([] if streamed_too else [pc.not_equal(field("snapshot"), "false")]),
        ],
    )
    return np.asarray(julian.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def _numpy(wire: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values with nulls as 0, validity)."""
    return wire.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), pc.is_valid(wire).to_numpy(
        zero_copy_only=False
    )


def _arrow_micros(encoding: Encoding, wire: pa.Array, name: str) -> tuple[np.ndarray, np.ndarray]:
    if encoding is Encoding.TIMESTAMP_ISO:
        texts = wire.to_pylist()
        micros = [None if t is None else iso_micros(t) for t in texts]
        if any(m is None and t is not None for m, t in zip(micros, texts, strict=True)):
            raise Misfit(f"column {name}: a value that is not a timestamp in range")
        valid = np.array([m is not None for m in micros], dtype=bool)
        if any(not -(2**63) <= m <= MAX_MICROS for m in micros if m is not None):
            raise Misfit(f"column {name}: a timestamp beyond int64 microseconds")
        return np.array([m or 0 for m in micros], dtype=np.int64), valid
    values, valid = _numpy(wire)
    if encoding in _MILLIS:
        try:
            return pc.multiply_checked(wire, 1000).fill_null(0).to_numpy(zero_copy_only=False), valid
        except pa.ArrowInvalid:
            raise Misfit(f"column {name}: a value overflows when scaled to microseconds") from None
    if encoding in _NANOS:
        return values // 1000, valid
    return values, valid


def arrow_convert(column: Column, wire: pa.Array, julian: np.ndarray, target: pa.DataType) -> pa.Array:
    """The values as ``target`` exactly as :func:`spark_convert` gives them; Misfit for any value that
    it would not convert."""
    enc, name = column.encoding, column.name
    if enc is Encoding.DATE_DAYS:
        days, valid = _numpy(wire)
        if np.any(valid & ((days < FIRST_DAY) | (days > LAST_DAY))):
            raise Misfit(f"column {name}: a date outside PostgreSQL's")
        return pc.cast(pc.cast(wire, pa.int32()), pa.date32())
    if enc is Encoding.DURATION_MICROS:
        if pc.any(pc.is_in(wire, pa.array(SATURATED_DURATIONS, pa.int64()))).as_py():
            raise Misfit(f"column {name}: a saturated MicroDuration")
        return wire
    micros, valid = _arrow_micros(enc, wire, name)
    if enc in _TIMES:
        if np.any(valid & ((micros < 0) | (micros >= MICROS_PER_DAY))):
            raise Misfit(f"column {name}: a time of day out of range")
        return pa.array(micros, pa.int64(), mask=~valid)
    if enc is not Encoding.TIMESTAMP_ISO and np.any(
        valid & np.isin(micros, [INFINITY_MICROS, MINUS_INFINITY_MICROS])
    ):
        raise Misfit(f"column {name}: PostgreSQL's infinity")
    rebase = valid & julian & (micros >= JULIAN_SNAPSHOT_MIN_MICROS) & (micros < GREGORIAN_START_MICROS)
    if rebase.any():
        micros = micros.copy()
        micros[rebase] = julian_to_gregorian(micros[rebase])
    if np.any(valid & (micros < MIN_MICROS)):
        raise Misfit(f"column {name}: a timestamp out of range")
    return pc.cast(pa.array(micros, pa.int64(), mask=~valid), target)
