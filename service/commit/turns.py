"""Taking turns with a compaction: why a position-delete table's commits and its compactions don't
overlap.

A compaction (``icesink maintain``, Spark's ``rewrite_data_files``) replaces data files with copies
that have their deletes applied. If the sink commits a position delete for a row of a file being
replaced while the rewrite runs, Iceberg's validation refuses the rewrite ("found new position delete
for replaced data file"): correct, since the compacted copy still holds the row, but at one commit a
second almost every rewrite lost that way, and the table was never compacted. (Equality deletes don't
collide: the rewritten files keep the rewrite's starting sequence number, so a newer equality delete
still applies to them.)

So they take turns through a named lock in the txnlog's Postgres: a rewrite of a table holds it alone;
a commit with position deletes for that table holds it shared, waiting while a rewrite runs (up to
``commit.compaction_wait``), and a rewrite waits for the commit in flight. A commit that resolved its
deletes before the rewrite finds the rows moved and resolves them again
(:func:`service.keyindex.resolve.refresh`). Correctness never rests on the lock: it only decides who
goes first. A lock not taken in time, or a log that can't be reached, means going ahead without it,
and Iceberg's validation still refuses a rewrite that would bring a deleted row back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta

from txnlog import TransactionLog, TxnLogError

logger = logging.getLogger(__name__)


def lock_name(sink_id: str, table: str) -> str:
    return f"{sink_id}/compaction/{table}"


@contextmanager
def compaction_turn(
    log: TransactionLog, sink_id: str, tables: list[str], *, rewrite: bool, wait: timedelta
) -> Iterator[float]:
    """The block runs in the turn of each of ``tables``: alone for a rewrite (``rewrite``), beside
    other commits otherwise. Yields how long it waited (for the turn, or for ``wait`` to run out or
    the log to fail: then the block runs without it). All on one connection: a batch may commit to
    many tables."""
    if not tables:
        yield 0.0
        return
    who = "compaction" if rewrite else "commit"
    table = ", ".join(tables)
    started = time.monotonic()
    with ExitStack() as stack:
        try:
            taken = stack.enter_context(
                log.named_locks([lock_name(sink_id, t) for t in tables], shared=not rewrite, wait=wait)
            )
        except TxnLogError as exc:
            logger.warning(
                "%s of %s goes ahead without its turn: the txnlog's lock failed: %s", who, table, exc
            )
            taken = False
        waited = time.monotonic() - started
        other = "the sink's commit" if rewrite else "a compaction (icesink maintain)"
        if not taken and waited >= wait.total_seconds():
            logger.warning(
                "%s of %s goes ahead without its turn: %s still held it after %s", who, table, other, wait
            )
        elif taken and waited >= 1.0:
            logger.info("%s of %s waited %.1f s for %s to finish", who, table, waited, other)
        yield waited
