"""Which delete format a table is written with: the configuration, else (``auto``) the table's own record."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from service.config import TableConfig
from service.iceberg.tables import DELETE_FORMAT_PROPERTY, created_delete_format, delete_format


def _table(properties: dict[str, str]) -> Any:
    return SimpleNamespace(properties=properties)


def test_equality_is_the_default() -> None:
    settings = TableConfig(identifier="lake.t", key=["id"])
    assert settings.delete_format == "equality"
    assert created_delete_format(settings) == "equality"
    assert delete_format(_table({DELETE_FORMAT_PROPERTY: "position"}), settings) == "equality"


@pytest.mark.parametrize(
    ("recorded", "chosen"),
    [
        ({DELETE_FORMAT_PROPERTY: "position"}, "position"),
        ({DELETE_FORMAT_PROPERTY: "equality"}, "equality"),
        ({}, "equality"),
    ],
)
def test_auto_follows_what_the_table_records(recorded: dict[str, str], chosen: str) -> None:
    settings = TableConfig(identifier="lake.t", key=["id"], delete_format="auto")
    assert created_delete_format(settings) == "position"  # a table the sink creates
    assert (
        delete_format(_table(recorded), settings) == chosen
    )  # one that exists: a table no sink marked is equality


def test_an_explicit_format_wins_over_the_table() -> None:
    settings = TableConfig(identifier="lake.t", key=["id"], delete_format="position")
    assert delete_format(_table({DELETE_FORMAT_PROPERTY: "equality"}), settings) == "position"
