"""A table's bad records of a batch, to the dead-letter topic, whichever decoder found them."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from service.config import SinkConfig
from service.data.envelope import ERROR_COLUMN, RECORD_POSITION, record_field
from service.kafka import dead_letter
from service.metrics import SinkMetrics


def send_decoded(config: SinkConfig, metrics: SinkMetrics, bad: DataFrame) -> None:
    """Spark's decoder's dead letters (the records with an error column), sent from its tasks."""
    records = bad.select(
        *[F.col(record_field(name)).alias(name) for name in ("key", "value", *RECORD_POSITION)],
        F.col(ERROR_COLUMN).alias("error"),
    )
    sent = dead_letter.send(records, config.kafka, config.dead_letter_topic, config.sink_id)
    if sent.failed:
        metrics.dead_letters_failed.add(len(sent.failed), metrics.attrs())


def send_found(config: SinkConfig, metrics: SinkMetrics, dead: pa.Table | None) -> None:
    """The records an Avro or Protobuf batch's tasks found bad (handed back to the driver: they are few). Sent last
    in the batch's retried attempt, so that a retry (its files could not be written) does not send them
    twice."""
    if dead is None or not dead.num_rows:
        return
    sent = dead_letter.send_rows(dead, config.kafka, config.dead_letter_topic, config.sink_id)
    if sent.failed:
        metrics.dead_letters_failed.add(len(sent.failed), metrics.attrs())
