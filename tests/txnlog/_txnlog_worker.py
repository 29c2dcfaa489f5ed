"""A txnlog client in its own OS process, for tests that need real concurrency or a real kill.

Driven over stdin/stdout one line at a time; the DSN comes from ICESINK_PG_DSN.

    claim-race SCHEMA SINK OWNER
        ready -> (go) -> claim, "epoch N" -> (go) -> precommit, "precommit ok|fenced E"
        -> (go) -> commit, "commit ok|fenced E"
    hold SCHEMA SINK OWNER IDLE_TIMEOUT_S
        claim, precommit, enter `committing`, "locked EPOCH SEQ", then wait for a line on
        stdin inside the block (the test kills or stops the process meanwhile); on "finish" leave the
        block normally and report "done ok|fenced E|error MSG".
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

from txnlog import Fenced, RetryPolicy, TransactionLog

RETRY = RetryPolicy(deadline=timedelta(seconds=30), initial_backoff=timedelta(milliseconds=5))


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_for(word: str) -> None:
    line = sys.stdin.readline()
    if line.strip() != word:
        raise SystemExit(f"expected {word!r} on stdin, got {line!r}")


def claim_race(schema: str, sink_id: str, owner: str) -> None:
    log = TransactionLog(os.environ["ICESINK_PG_DSN"], schema=schema, retry=RETRY)
    log.ensure_schema()
    # Open a pooled connection now so the race is between claims, not between process start-ups.
    log.state(sink_id)
    say("ready")
    wait_for("go")
    lease = log.claim(sink_id, owner)
    say(f"epoch {lease.epoch}")
    wait_for("go")
    try:
        log.precommit(lease, {"owner": owner, "epoch": lease.epoch})
        say("precommit ok")
    except Fenced as exc:
        say(f"precommit fenced {exc.current_epoch}")
    wait_for("go")
    try:
        log.commit(lease)
        say("commit ok")
    except Fenced as exc:
        say(f"commit fenced {exc.current_epoch}")
    log.close()


def hold(schema: str, sink_id: str, owner: str, idle_timeout_s: str) -> None:
    log = TransactionLog(
        os.environ["ICESINK_PG_DSN"],
        schema=schema,
        retry=RETRY,
        idle_in_transaction_timeout=timedelta(seconds=float(idle_timeout_s)),
        application_name=f"txnlog-hold-{owner}",  # lets the test find this writer's sessions
    )
    lease = log.claim(sink_id, owner)
    state = log.precommit(lease, {"owner": owner, "files": ["a.parquet", "b.parquet"], "offsets": {"0": 42}})
    try:
        with log.committing(lease, seq=state.seq) as handle:
            say(f"locked {handle.lease.epoch} {handle.seq}")
            wait_for("finish")
        say("done ok")
    except Fenced as exc:
        say(f"done fenced {exc.current_epoch}")
    except Exception as exc:
        say(f"done error {type(exc).__name__}: {exc}")
    log.close()


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "claim-race":
        claim_race(*args)
    elif command == "hold":
        hold(*args)
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
