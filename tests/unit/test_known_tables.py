"""The table metadata a batch reuses from the sink's last commit (service.iceberg.tables.KnownTables)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from pyiceberg.table import Table

from service.iceberg.tables import KnownTables


class _Table:
    """What KnownTables reads of a table: its metadata location (and its catalog)."""

    def __init__(self, location: str) -> None:
        self.metadata_location = location
        self.catalog: Any = None


def _t(location: str) -> Table:
    return cast(Table, _Table(location))


def test_a_commit_advances_the_table_it_was_built_on() -> None:
    known = KnownTables()
    known.put("db.t", _t("v1"), loaded=True)
    known.advance("db.t", "v1", _t("v2"))
    got = known.get("db.t")
    assert got is not None and got.metadata_location == "v2"


def test_a_commit_in_the_background_never_puts_back_older_metadata() -> None:
    """The pipeline loaded the table again (after evolving its schema) while a commit built on the
    older metadata was in flight: that commit's result does not replace the newer load."""
    known = KnownTables()
    known.put("db.t", _t("v1"), loaded=True)
    known.put("db.t", _t("v1-evolved"), loaded=True)
    known.advance("db.t", "v1", _t("v2"))
    got = known.get("db.t")
    assert got is not None and got.metadata_location == "v1-evolved"


def test_a_table_known_too_long_is_loaded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another engine's schema or spec change makes no snapshot, so no commit conflicts on it: the
    sink loads the table again at least every MAX_AGE_S."""
    known = KnownTables()
    known.put("db.t", _t("v1"), loaded=True)
    known.advance("db.t", "v1", _t("v2"))  # a commit does not restart the clock; a load does
    monkeypatch.setattr(KnownTables, "MAX_AGE_S", 0.0)
    assert known.get("db.t") is None


def test_a_forgotten_table_is_loaded() -> None:
    known = KnownTables()
    known.put("db.t", _t("v1"), loaded=True)
    known.forget("db.t")
    assert known.get("db.t") is None
