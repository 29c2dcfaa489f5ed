"""Connect decimals decoded with numpy take exactly what the per-value loop takes (no servers)."""

from __future__ import annotations

import base64
import random

import pyarrow as pa
import pytest
from pyiceberg.types import DecimalType

from service.data.arrow_decode import Declined, _unscaled, _unscaled_int64
from service.model.columns import Column, Encoding


def _encoding(value: int, size: int) -> str:
    return base64.b64encode(value.to_bytes(size, "big", signed=True)).decode()


def _wire(rng: random.Random, n: int) -> list[str | None]:
    out: list[str | None] = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.1:
            out.append(None)
            continue
        value = rng.choice([0, 1, -1, 127, -128, 128, -129, 2**31, -(2**31) - 1, 10**12 - 1, -(10**12) + 1])
        value = value if rng.random() < 0.5 else rng.randint(-(10**12) + 1, 10**12 - 1)
        least = max(1, (value.bit_length() + 8) // 8)
        out.append(_encoding(value, rng.randint(least, 8)))  # sign-extended encodings too
    return out


def _both(wire: list[str | None], precision: int = 12) -> tuple[object, object]:
    column = Column("amount", DecimalType(precision, 2), False, Encoding.DECIMAL_BASE64)
    array = pa.array(wire, pa.string())
    results: list[object] = []
    for decode in (_unscaled_int64, _unscaled):
        try:
            got = decode(array, column, 10**precision)
            results.append(got.to_pylist() if isinstance(got, pa.Array) else got)
        except Declined as exc:
            results.append(type(exc))
    return results[0], results[1]


@pytest.mark.parametrize("seed", range(20))
def test_numpy_decimals_equal_the_loop(seed: int) -> None:
    rng = random.Random(seed)
    fast, loop = _both(_wire(rng, rng.randint(1, 400)))
    assert fast == loop


@pytest.mark.parametrize(
    "bad",
    ["AA=", "A===", "AAAA AAAA", "AB=A", "", "!!!!", "AAAAAAAAAAAA\n"],
)
def test_a_value_the_loop_declines_is_declined(bad: str) -> None:
    fast, loop = _both(["AAE=", bad, None])
    assert loop is Declined and fast is Declined


def test_out_of_range_is_declined_at_the_columns_precision() -> None:
    fast, loop = _both([_encoding(10**4, 2), _encoding(-(10**4), 3)], precision=4)
    assert loop is Declined and fast is Declined
    assert _both([_encoding(9_999, 2), _encoding(-9_999, 8)], precision=4) == ([9_999, -9_999],) * 2


def test_a_value_longer_than_eight_bytes_is_left_to_the_loop() -> None:
    fast, loop = _both([_encoding(5, 9), None])
    assert fast is None and loop == [5, None]


def test_only_nulls() -> None:
    assert _both([None, None]) == ([None, None], [None, None])
