"""A dead letter is cut to the topic's limit, headers first, then the key, then the value."""

from __future__ import annotations

from service.kafka.dead_letter import FRAMING_BYTES, MAX_ERROR_BYTES, Header, fit

HEADERS: list[Header] = [("icesink.error", b"malformed"), ("icesink.source.offset", b"7")]


def _size(key: bytes | None, value: bytes | None, headers: list[Header]) -> int:
    return len(key or b"") + len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers)


def test_a_record_that_fits_is_unchanged() -> None:
    assert fit(b"k", b"v" * 100, list(HEADERS), 10_000) == (b"k", b"v" * 100, HEADERS)


def test_a_large_value_is_cut_and_says_so() -> None:
    key, value, headers = fit(b"k", b"v" * 50_000, list(HEADERS), 5_000)
    assert key == b"k" and value is not None and 0 < len(value) < 5_000
    assert _size(key, value, headers) + FRAMING_BYTES <= 5_000
    named = dict(headers)
    assert (named["icesink.truncated"], named["icesink.value.size"], named["icesink.key.size"]) == (
        b"true",
        b"50000",
        b"1",
    )
    assert headers[: len(HEADERS)] == HEADERS


def test_a_key_too_large_leaves_no_room_for_the_value() -> None:
    key, value, headers = fit(b"k" * 9_000, b"v" * 10, list(HEADERS), 5_000)
    assert value == b"" and key is not None and 0 < len(key) < 5_000
    assert _size(key, value, headers) + FRAMING_BYTES <= 5_000


def test_a_reason_quoting_a_huge_value_is_cut_so_the_record_fits() -> None:
    """The reason of a value that does not fit its column quotes the value: 100 kB of it would make
    the headers alone larger than a 20 kB topic takes, and the dead letter would never be delivered."""
    huge = "é" * 50_000  # 100 kB of two-byte characters
    reason = f"column i16: value {huge} does not fit type int".encode()
    headers: list[Header] = [("icesink.error", reason), ("icesink.source.offset", b"7")]
    assert _size(None, None, headers) > 20_000  # the fault: the headers alone are over the limit

    key, value, fitted = fit(b"k", huge.encode(), headers, 20_000)

    assert _size(key, value, fitted) + FRAMING_BYTES <= 20_000
    error = dict(fitted)["icesink.error"]
    assert isinstance(error, bytes) and len(error) <= MAX_ERROR_BYTES
    text = error.decode()  # still whole characters
    assert text.startswith("column i16: value éé") and text.endswith(f"(cut from {len(reason)} bytes)")
    assert dict(fitted)["icesink.source.offset"] == b"7" and key == b"k" and value
