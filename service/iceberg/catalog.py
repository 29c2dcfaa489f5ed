"""The sink's catalog connection: requests with a timeout, and start-up calls retried."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from pyiceberg.catalog import Catalog

from service.config import SinkConfig
from service.iceberg.tables import open_catalog, request_timeout_s
from service.retrying import Backoff, catalog_answer, log_failure, retry_call

logger = logging.getLogger(__name__)
T = TypeVar("T")


def bound_catalog_requests(catalog: Catalog, timeout_s: float) -> None:
    """Give the REST catalog's HTTP requests a timeout; pyiceberg sets none (a Hive metastore's calls
    get theirs when the catalog opens: :func:`service.iceberg.hive.bound_metastore_calls`).

    A catalog that accepts a request and never answers would otherwise stall the sink for good. A
    commit that times out is an unknown outcome: the Committer looks for its snapshot, then retries.
    """
    session = getattr(catalog, "_session", None)
    if session is None:
        return
    send = session.request

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = timeout_s
        return send(method, url, *args, **kwargs)

    session.request = request


def catalog_retries(config: SinkConfig, what: str, call: Callable[[], T]) -> T:
    """Run a step that talks to the catalog (start-up's, or the load before held rows are written),
    again after an answer that may pass.

    A catalog whose database connection was just reset answers a 500 once, a busy one a 429: start-up
    waits and tries again (``commit.retries`` attempts, backoff 0.5 s doubling to 10 s) instead of
    crashing. Every start-up step is safe to run again: it loads what exists and creates only what is
    missing.
    """
    attempts = config.commit.retries
    return retry_call(
        call,
        Backoff(attempts, initial_s=0.5, max_s=10.0),
        retry_on=lambda exc: catalog_answer(exc) is not None,
        on_failure=log_failure(logger, what, attempts),
    )


def connect(config: SinkConfig) -> Catalog:
    """The catalog, connected with start-up retries, its requests bounded by ``icesink.request-timeout``."""
    catalog = catalog_retries(config, "connecting to the catalog", lambda: open_catalog(config))
    bound_catalog_requests(catalog, request_timeout_s(config))
    return catalog
