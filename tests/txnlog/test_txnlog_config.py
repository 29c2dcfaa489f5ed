"""Configuration: secrets stay out of messages, session settings reach the server."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from txnlog import RetryPolicy, TransactionLog, TxnLogError, Unavailable

MakeLog = Callable[..., TransactionLog]

SECRET = "s3cr3t-Pa55word-xyzzy"


def _with_password(dsn: str, password: str) -> str:
    return make_url(dsn).set(password=password).render_as_string(hide_password=False)


def test_repr_and_dsn_property_mask_the_password(txnlog_dsn: str) -> None:
    log = TransactionLog(_with_password(txnlog_dsn, SECRET))
    assert SECRET not in repr(log) and SECRET not in log.dsn and SECRET not in str(log.settings)
    assert "***" in repr(log)
    assert log.dsn.startswith("postgresql+psycopg://")


def test_wrong_password_fails_fast_without_leaking_it(
    txnlog_dsn: str, txnlog_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    log = TransactionLog(
        _with_password(txnlog_dsn, SECRET),
        schema=txnlog_schema,
        retry=RetryPolicy(max_attempts=5, deadline=timedelta(seconds=10)),
    )
    caplog.set_level(logging.DEBUG)
    with pytest.raises(TxnLogError) as info:
        log.claim("s", "pod")
    # Authentication failures are not transient: no retries, no Unavailable.
    assert not isinstance(info.value, Unavailable)
    assert "authentication failed" in str(info.value)
    assert "transient" not in caplog.text
    rendered = "".join(traceback.format_exception(info.value)) + str(info.value) + caplog.text
    assert SECRET not in rendered
    log.close()


def test_unreachable_server_gives_up_with_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    log = TransactionLog(
        f"postgresql://icesink:{SECRET}@127.0.0.1:1/icesink",
        connect_timeout=timedelta(seconds=1),
        retry=RetryPolicy(max_attempts=3, deadline=timedelta(seconds=5), max_backoff=timedelta(seconds=0.1)),
    )
    caplog.set_level(logging.WARNING, logger="txnlog")
    with pytest.raises(Unavailable) as info:
        log.state("s")
    assert info.value.retryable
    assert "***" in str(info.value) and SECRET not in str(info.value)
    assert caplog.text.count("transient database error") == 2  # attempts 1 and 2 slept, 3 gave up
    assert SECRET not in caplog.text and "***" in caplog.text


def test_password_can_come_separately(txnlog_dsn: str, txnlog_schema: str) -> None:
    url = make_url(txnlog_dsn)
    bare = url.set(password=None).render_as_string(hide_password=False)
    log = TransactionLog(bare, schema=txnlog_schema, password=url.password)
    assert log.claim("s", "pod").epoch == 1
    log.close()


def test_from_env(monkeypatch: pytest.MonkeyPatch, txnlog_dsn: str) -> None:
    monkeypatch.delenv("SOME_UNSET_VAR", raising=False)
    with pytest.raises(TxnLogError, match="SOME_UNSET_VAR is not set"):
        TransactionLog.from_env("SOME_UNSET_VAR")
    monkeypatch.setenv("SOME_SET_VAR", txnlog_dsn)
    assert TransactionLog.from_env("SOME_SET_VAR", schema="x").schema == "x"


def test_unsupported_driver_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported DSN driver"):
        TransactionLog("mysql://u:p@h/db")
    with pytest.raises(ValueError, match="invalid Postgres DSN") as info:
        TransactionLog(f"::not a url {SECRET}")
    assert SECRET not in str(info.value) and info.value.__cause__ is None


def test_session_settings_reach_the_server(make_log: MakeLog) -> None:
    log = make_log(
        lock_timeout=timedelta(milliseconds=1500),
        idle_in_transaction_timeout=timedelta(seconds=3),
        statement_timeout=timedelta(seconds=7),
        keepalives_idle=timedelta(seconds=4),
        keepalives_interval=timedelta(seconds=2),
        keepalives_count=2,
        tcp_user_timeout=timedelta(seconds=9),
        application_name="txnlog-settings-test",
    )
    log.ensure_schema()
    names = [
        "lock_timeout",
        "idle_in_transaction_session_timeout",
        "statement_timeout",
        "tcp_keepalives_idle",
        "tcp_keepalives_interval",
        "tcp_keepalives_count",
        "tcp_user_timeout",
        "application_name",
    ]
    with log._engine.connect() as conn:
        got = {n: conn.execute(text(f"SELECT current_setting('{n}')")).scalar_one() for n in names}
    assert got == {
        "lock_timeout": "1500ms",
        "idle_in_transaction_session_timeout": "3s",
        "statement_timeout": "7s",
        "tcp_keepalives_idle": "4",
        "tcp_keepalives_interval": "2",
        "tcp_keepalives_count": "2",
        "tcp_user_timeout": "9000",  # milliseconds, shown without a unit
        "application_name": "txnlog-settings-test",
    }
    assert log.settings.dead_peer_bound == timedelta(seconds=8)


def test_invalid_settings_are_refused(txnlog_dsn: str) -> None:
    with pytest.raises(ValueError, match="lock_timeout must be positive"):
        TransactionLog(txnlog_dsn, lock_timeout=timedelta(0))
    with pytest.raises(ValueError, match="history_retention"):
        TransactionLog(txnlog_dsn, history_retention=0)
