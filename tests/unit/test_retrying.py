"""What the catalog's failures mean to the retry loop: a dropped connection of every catalog type
icesink talks to is an unknown outcome (a commit looks for its snapshot, then tries again)."""

from __future__ import annotations

import pytest
import requests
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from thrift.transport.TTransport import TTransportException

from service.retrying import CatalogAnswer, catalog_answer


@pytest.mark.parametrize(
    "failure",
    [
        requests.exceptions.ConnectionError("REST catalog unreachable"),
        TTransportException(TTransportException.NOT_OPEN, "Could not connect to ('127.0.0.1', 9083)"),
        TTransportException(TTransportException.END_OF_FILE, "TSocket read 0 bytes"),
        EndpointConnectionError(endpoint_url="https://glue.eu-west-1.amazonaws.com/"),
        ReadTimeoutError(endpoint_url="https://glue.eu-west-1.amazonaws.com/"),
    ],
    ids=["rest", "hive-unreachable", "hive-dropped", "glue-unreachable", "glue-timeout"],
)
def test_a_dropped_catalog_connection_is_an_unknown_outcome(failure: BaseException) -> None:
    assert catalog_answer(failure) is CatalogAnswer.UNKNOWN_OUTCOME


def test_a_conflict_and_a_missing_table_keep_their_meaning() -> None:
    assert catalog_answer(CommitFailedException("branch moved")) is CatalogAnswer.CONFLICT
    assert catalog_answer(NoSuchTableError("t")) is None
