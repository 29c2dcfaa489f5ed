"""Parsing of human-friendly sizes (``64MiB``) and durations (``10s``, ``5m``)."""

from __future__ import annotations

import re
from datetime import timedelta

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")


def parse_size(value: str | int) -> int:
    """Return a byte count for ``512MiB``, ``64 MB``, ``1048576`` and the like."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative: {value}")
        return value
    match = _SIZE_RE.match(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"not a size: {value!r} (use e.g. 64MiB, 10MB, 4096)")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_duration(value: str | int | float | timedelta) -> timedelta:
    """Return a timedelta for ``250ms``, ``10s``, ``5m``, ``1h``, ``1d`` (a bare number means seconds)."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    match = _DURATION_RE.match(value)
    if match is None:
        raise ValueError(f"not a duration: {value!r} (use e.g. 250ms, 10s, 5m, 1h, 1d)")
    return timedelta(seconds=float(match.group(1)) * _DURATION_UNITS[match.group(2)])
