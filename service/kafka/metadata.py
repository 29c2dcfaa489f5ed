"""Topic metadata asked of the brokers for the topics a caller needs, not for the whole cluster.

A metadata request without topics is answered with every topic of the cluster and its partitions:
on a cluster of thousands of topics that is a large answer for the broker to build and for the
client to parse, and the sink's source asks every few seconds. A sink that names its topics asks for
those; only a topic pattern needs the whole list.

A request that names a topic the cluster lacks makes a broker with ``auto.create.topics.enable``
create it when the client allows it, which librdkafka does by default for a producer and so for an
admin client: the clients of the callers here say ``allow.auto.create.topics: false``
(:data:`NO_AUTO_CREATE`), and a missing topic comes back with its error (unknown topic) instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

NO_AUTO_CREATE = {"allow.auto.create.topics": False}


def topics_metadata(client: Any, topics: Iterable[str] | None, timeout_s: float) -> dict[str, Any]:
    """``TopicMetadata`` by name, of ``topics`` (one request each), or of every topic when ``topics``
    is None. A topic the cluster lacks is there with its error and no partitions. ``client`` is a
    confluent-kafka Consumer or AdminClient (configured with :data:`NO_AUTO_CREATE`)."""
    if topics is None:
        return dict(client.list_topics(timeout=timeout_s).topics)
    found: dict[str, Any] = {}
    for topic in topics:
        found.update(client.list_topics(topic, timeout=timeout_s).topics)
    return found
