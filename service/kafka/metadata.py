"""Topic partitions asked of the brokers for the topics a caller needs, not for the whole cluster.

A metadata request without topics is answered with every topic of the cluster and its partitions:
on a cluster of thousands of topics that is a large answer for the broker to build and for the
client to parse, and the sink's source asks every few seconds. A sink that names its topics asks for
those, in one request; only a topic pattern needs the whole list.

A request that names a topic the cluster lacks makes a broker with ``auto.create.topics.enable``
create it when the client allows it, which librdkafka does by default for a producer and so for an
admin client: icesink's clients say ``allow.auto.create.topics: false`` (:data:`NO_AUTO_CREATE`,
over anything in ``kafka.options``), and a missing topic is answered as unknown instead.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection

NO_AUTO_CREATE = {"allow.auto.create.topics": False}


def partitions(admin: Any, topics: list[str] | None, timeout_s: float) -> dict[str, list[int]]:
    """The partitions of each of ``topics`` the cluster has, described in one request (a topic it
    lacks, deleted or never created, is left out), or of every topic of the cluster when ``topics``
    is None. ``admin``: a confluent-kafka AdminClient configured with :data:`NO_AUTO_CREATE`. Raises
    ``KafkaException`` when the cluster does not answer."""
    if topics is None:
        listed = admin.list_topics(timeout=timeout_s).topics
        return {
            t: sorted(info.partitions) for t, info in listed.items() if info.error is None and info.partitions
        }
    found: dict[str, list[int]] = {}
    if not topics:  # (a describe request must name one)
        return found
    futures = admin.describe_topics(TopicCollection(list(topics)), request_timeout=timeout_s)
    for topic, future in futures.items():
        try:
            described = future.result(timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            raise
        except TimeoutError:  # the future's own wait: no broker answered (the callers catch one type)
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, f"no answer describing {topic!r} within {timeout_s} s")
            ) from None
        if described.partitions:
            found[topic] = sorted(p.id for p in described.partitions)
    return found
