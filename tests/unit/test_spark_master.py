"""service.spark_session.check_master: a cluster's master must answer on its port before the sink
claims anything; a local master needs no server."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from service.spark_session import SparkUnavailable, check_master


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield int(server.getsockname()[1])


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_local_master_needs_no_server() -> None:
    assert check_master("local[2]") == "local[2]: runs in this process"


def test_a_standalone_master_that_answers(listening: int) -> None:
    assert (
        check_master(f"spark://127.0.0.1:{listening}")
        == f"spark://127.0.0.1:{listening}: 127.0.0.1:{listening} answers"
    )


def test_one_master_of_an_ha_list_is_enough(listening: int) -> None:
    dead = _closed_port()
    master = f"spark://127.0.0.1:{dead},127.0.0.1:{listening}"
    assert check_master(master).endswith(f"127.0.0.1:{listening} answers")


def test_no_master_answers_names_each_address() -> None:
    first, second = _closed_port(), _closed_port()
    master = f"spark://127.0.0.1:{first},127.0.0.1:{second}"
    with pytest.raises(SparkUnavailable) as raised:
        check_master(master, timeout_s=2)
    message = str(raised.value)
    assert message.startswith(f"spark.master {master}: no master answers (127.0.0.1:{first}: ")
    assert f"127.0.0.1:{second}: " in message and "Connection refused" in message


def test_a_kubernetes_api_server_is_checked_at_its_port(listening: int) -> None:
    assert check_master(f"k8s://http://127.0.0.1:{listening}").endswith("answers")
    with pytest.raises(SparkUnavailable, match=r"k8s://https://127\.0\.0\.1:\d+: no master answers"):
        check_master(f"k8s://https://127.0.0.1:{_closed_port()}", timeout_s=2)


def test_addresses_without_a_port_get_the_default_one() -> None:
    from service.spark_session import _with_port

    assert _with_port("m1", 7077) == "m1:7077"
    assert _with_port("m1:7000", 7077) == "m1:7000"
    assert _with_port("[fd00::1]", 443) == "[fd00::1]:443"
    assert _with_port("[fd00::1]:6443", 443) == "[fd00::1]:6443"


def test_spaces_in_an_ha_list_are_ignored(listening: int) -> None:
    assert check_master(f"spark://127.0.0.1:{_closed_port()}, 127.0.0.1:{listening}").endswith("answers")
