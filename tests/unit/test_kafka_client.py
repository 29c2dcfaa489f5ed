"""One set of Kafka client properties for Spark's Java source and librdkafka (the task reader)."""

from __future__ import annotations

from typing import Any

import confluent_kafka.admin
import pytest

from service import sample
from service.config import KafkaConfig
from service.kafka import dead_letter, lookups, stream_source
from service.kafka.lookups import client_config, jaas_credentials, task_client


def test_scram_credentials_in_a_jaas_config_are_mapped_for_librdkafka() -> None:
    jaas = (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="p\\"w";'
    )
    assert jaas_credentials(jaas) == {"sasl.username": "alice", "sasl.password": 'p"w'}


def test_a_login_module_without_a_password_maps_to_nothing() -> None:
    assert jaas_credentials("com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;") == {}


PLAIN = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";'


def _kafka(**options: str) -> KafkaConfig:
    return KafkaConfig(bootstrap_servers="k:9092", topics=["t"], options=options)


def test_the_task_reader_gets_librdkafkas_properties_and_the_isolation_level() -> None:
    kafka = _kafka(
        **{
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": PLAIN,
            "ssl.truststore.location": "/etc/kafka/truststore.jks",
        }
    )
    client = task_client(kafka)
    assert client["sasl.username"] == "u" and client["sasl.password"] == "p"
    assert client["isolation.level"] == "read_committed"
    assert "sasl.jaas.config" not in client and "ssl.truststore.location" not in client
    assert "logger" not in client  # a logger object does not travel to the tasks
    assert "logger" in client_config(kafka)


def test_credentials_given_for_librdkafka_win_over_the_jaas_config() -> None:
    kafka = _kafka(**{"sasl.username": "direct", "sasl.jaas.config": PLAIN})
    assert task_client(kafka)["sasl.username"] == "direct"


class _Refused(Exception):
    pass


def test_no_client_of_the_sink_lets_a_metadata_request_create_a_topic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request that names a topic the cluster lacks creates it on a broker with
    auto.create.topics.enable when the client allows it (librdkafka's producer default, so an admin
    client's): every client that names topics says no, over ``kafka.options``."""
    kafka = _kafka(**{"allow.auto.create.topics": "true"})
    made: list[dict[str, Any]] = []

    def record(config: dict[str, Any], **kwargs: Any) -> Any:
        made.append({**config, **kwargs})
        raise _Refused

    for module in (lookups, dead_letter, stream_source, confluent_kafka.admin):  # sample's: imported late
        for name in ("AdminClient", "Consumer"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, record)
    attempts = [
        lambda: lookups.admin(kafka),
        lambda: lookups.consumer(kafka),
        lambda: dead_letter.topic_max_bytes(kafka, "t.dlq"),
        lambda: stream_source.RangeReader(
            stream_source.RangePlan(client=lookups.task_client(kafka))
        )._client(),
        lambda: sample.ensure_topic("k:9092", "t"),
    ]
    for attempt in attempts:
        with pytest.raises(_Refused):
            attempt()
    assert len(made) == len(attempts)
    assert [m["allow.auto.create.topics"] for m in made] == [False] * len(attempts), made
    assert lookups.task_client(kafka)["allow.auto.create.topics"] is False  # the tasks' reader
