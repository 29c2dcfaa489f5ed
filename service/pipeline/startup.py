"""Start-up after the claim: make the log, the tables and the offsets agree before anything is read.

Check that no table holds a commit of this sink newer than the log knows, finish a plan left in
precommit, check that Kafka still holds the committed offsets, and record ``starting_offsets: latest``
for topics never read. Only then does the stream start, from the offsets the txnlog holds.
"""

from __future__ import annotations

import logging
from functools import partial

from pyiceberg.catalog import Catalog

from service.commit.committer import Committer
from service.config import SinkConfig
from service.iceberg.catalog import catalog_retries
from service.pipeline.cadence import CommitCadence
from service.pipeline.outcome import BatchOutcome
from service.pipeline.positions import Positions
from service.pipeline.read import Reader
from service.pipeline.routes import Routes
from service.retrying import Backoff, retry_call
from txnlog import Lease, LockTimeout, TransactionLog

logger = logging.getLogger(__name__)


def claim(log: TransactionLog, sink_id: str, owner: str, attempts: int = 5) -> Lease:
    """Claim the sink (fencing older replicas), waiting for a predecessor that still holds the row in
    the middle of a commit.

    Each try waits up to ``txnlog.lock_timeout``; a hung predecessor's session is ended by Postgres
    after ``txnlog.session_timeout``, so a few tries are enough.
    """

    def waiting(attempt: int, _: BaseException) -> None:
        logger.warning(
            "sink %s: another replica holds the txnlog row (committing); waiting (%d/%d)",
            sink_id,
            attempt,
            attempts,
        )

    lease = retry_call(
        lambda: log.claim(sink_id, owner),
        Backoff(attempts=attempts, initial_s=0.1, max_s=1.0),
        retry_on=lambda exc: isinstance(exc, LockTimeout),
        on_failure=waiting,
    )
    logger.info("sink %s claimed epoch %d as %s", sink_id, lease.epoch, owner)
    return lease


def arrow_first(config: SinkConfig, cadence: CommitCadence) -> bool:
    """Whether batches go through the one-job Arrow path first (:mod:`service.data.arrow_job`)."""
    reason = None
    if config.source.decoder == "spark":
        reason = "source.decoder is spark"
    elif not cadence.every_trigger:
        reason = "commit.min_size/max_period buffer batches"
    if reason:
        logger.info("decoding every batch with Spark's decoder: %s", reason)
        return False
    logger.info("decoding with the Arrow decoder; Spark's decoder takes any batch it declines")
    return True


def recover(
    config: SinkConfig,
    committer: Committer,
    catalog: Catalog,
    routes: Routes,
    reader: Reader,
    positions: Positions,
) -> None:
    """Finish what the last replica left in precommit and resume from the committed offsets."""
    for identifier in routes.pipelines:
        load = partial(catalog.load_table, identifier)
        committer.check_log_is_current(
            catalog_retries(config, f"reading the sink's commits in {identifier}", load)
        )
    committer.recover()
    committed = committer.committed()
    reader.check_committed(committed)
    positions.resume(committed.offsets if committed else {})
    if (latest := positions.latest_to_record(reader.partitions)) is None:
        return
    offsets, topics = latest
    plan, _ = BatchOutcome(
        offsets,
        dict(reader.topic_ids),
        table=routes.one_table,
        routes=routes.recorded,
        note=f"starting_offsets latest, resolved for {topics}",
    ).plan()
    seq = committer.commit(plan).seq
    positions.resume(offsets)
    latest_offsets = {t: offsets[t] for t in topics}
    logger.info(
        "starting_offsets latest: recorded the latest offsets %s in the txnlog (seq %d)", latest_offsets, seq
    )
