"""Catalog authentication: each method authenticates for real, and wrong credentials are refused.

The REST catalog sits behind tests/sink/auth_proxy.py, which enforces one method at a time. The
cheap checks use `icesink check` (no Spark); one full sink run goes through OAuth2.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyiceberg.catalog.glue import GlueCatalog

from service.config import parse_config
from service.iceberg.tables import open_catalog
from tests.sink.auth_proxy import TOKEN_PATH, AuthProxy
from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows


@pytest.fixture
def proxy(stack: Any, request: pytest.FixtureRequest) -> Iterator[tuple[AuthProxy, str]]:
    auth = AuthProxy(
        upstream=stack.rest_uri,
        mode=request.param,
        token="t0ken",
        client_id="sink",
        client_secret="s3cret",
        username="ice",
        password="p4ss",
        access_key=stack.access_key,
    )
    url, server = auth.serve()
    yield auth, url
    server.stop()


def _catalog(stack: Any, url: str, **auth: Any) -> dict[str, Any]:
    return {
        "name": "rest",
        "type": "rest",
        "uri": url,
        "s3.endpoint": stack.s3_endpoint,
        "s3.access-key-id": stack.access_key,
        "s3.secret-access-key": stack.secret_key,
        "s3.region": stack.region,
        **auth,
    }


CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "bearer": ({"token": "t0ken"}, {"token": "wrong"}),
    "oauth2": (
        {"credential": "sink:s3cret", "oauth2-server-uri": "{url}" + TOKEN_PATH},
        {"credential": "sink:nope", "oauth2-server-uri": "{url}" + TOKEN_PATH},
    ),
    "basic": (
        {"auth": {"type": "basic", "basic": {"username": "ice", "password": "p4ss"}}},
        {"auth": {"type": "basic", "basic": {"username": "ice", "password": "nope"}}},
    ),
    "sigv4": (
        {"rest.sigv4-enabled": "true", "rest.signing-region": "us-east-1", "rest.signing-name": "glue"},
        {},
    ),
}


def _fill(props: dict[str, Any], url: str) -> dict[str, Any]:
    return {k: v.replace("{url}", url) if isinstance(v, str) else v for k, v in props.items()}


@pytest.mark.parametrize("proxy", list(CASES), indirect=True)
def test_check_authenticates_and_refuses_wrong_credentials(
    proxy: tuple[AuthProxy, str], make_sink: Any, stack: Any
) -> None:
    auth, url = proxy
    good, bad = CASES[auth.mode]
    sink: Sink = make_sink(catalog=_catalog(stack, url, **_fill(good, url)))
    ok = sink.cli("check")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok   catalog" in ok.stdout and auth.authorized > 0
    if auth.mode == "oauth2":
        assert auth.tokens_issued >= 1

    sink.config["catalog"] = _catalog(stack, url, **_fill(bad, url))
    refused = sink.cli("check")
    assert refused.returncode != 0
    assert "FAIL catalog" in refused.stdout, refused.stdout + refused.stderr
    for secret in ("s3cret", "p4ss", "t0ken", stack.secret_key):
        assert secret not in refused.stdout + refused.stderr


def test_sink_writes_through_an_oauth2_catalog(make_sink: Any, spark: Any, stack: Any) -> None:
    auth = AuthProxy(upstream=stack.rest_uri, mode="oauth2", client_id="sink", client_secret="s3cret")
    url, server = auth.serve()
    try:
        sink: Sink = make_sink(
            catalog=_catalog(
                stack, url, **{"credential": "${CATALOG_CREDENTIAL}", "oauth2-server-uri": url + TOKEN_PATH}
            ),
        )
        sink.produce(300)
        run = sink.run_until_caught_up(env={"CATALOG_CREDENTIAL": "sink:s3cret"})
        assert "s3cret" not in run.log()
    finally:
        server.stop()
    assert auth.tokens_issued >= 1 and auth.authorized > 0 and auth.refused == 0
    assert_rows(spark, sink.table, sink.source.expected_rows())


def test_glue_and_hive_properties_reach_pyiceberg(hive: str) -> None:
    """The configuration builds the right pyiceberg catalogs: Glue's client for the region given (the
    Glue tests of tests/sink/test_catalogs.py use moto's endpoint), and a Hive catalog that opens
    against the stack's metastore (opening one asks the metastore for a table: its calls are checked)."""
    base = {
        "sink_id": "s",
        "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"]},
        "table": {"identifier": "a.b", "key": ["id"]},
        "txnlog": {"dsn": "postgresql+psycopg://x@h/db"},
    }
    glue = parse_config(
        {
            **base,
            "catalog": {
                "name": "g",
                "type": "glue",
                "glue.region": "eu-west-1",
                "glue.access-key-id": "AKIA",
                "glue.secret-access-key": "x",
            },
        }
    )
    catalog = open_catalog(glue)
    assert isinstance(catalog, GlueCatalog)
    assert catalog.glue.meta.region_name == "eu-west-1"
    config = parse_config({**base, "catalog": {"name": "h", "type": "hive", "uri": hive}})
    catalog = open_catalog(config)
    assert type(catalog).__name__ == "HiveCatalog"
    assert catalog.properties["uri"] == hive
