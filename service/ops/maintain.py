"""``icesink maintain [--once]``: build the maintainer's servers, run it, turn the outcome into an exit code."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from datetime import timedelta

from service.config import ConfigError, SinkConfig

logger = logging.getLogger("icesink")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_FENCED = 0, 1, 2, 3

# A maintainer that finds a table's lease locked waits this long, then leaves the table for this pass.
LEASE_WAIT = timedelta(seconds=5)


def maintain(config: SinkConfig, once: bool) -> int:
    from service import failpoints
    from service.health import Health
    from service.iceberg.tables import open_catalog
    from service.maintenance.maintainer import Maintainer
    from service.maintenance.spark import catalog_conf, spark_catalog_name
    from service.metrics import setup_metrics
    from service.ops.common import command_owner
    from service.retrying import brief
    from service.spark_jars import SparkJarsError
    from service.spark_session import SparkUnavailable, build_spark
    from service.txnlog_client import open_txnlog
    from txnlog import Fenced

    failpoints.configure()
    # Installed first: a SIGTERM while the Spark session starts (tens of seconds on a busy node) ends
    # the process cleanly once it has started, instead of killing it mid-start-up.
    stop = threading.Event()

    def request_stop(*_: object) -> None:
        logger.info("stop requested: finishing the task in flight, then exiting")
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        name = spark_catalog_name(config)
        spark_catalog = catalog_conf(config, name)
    except ConfigError as exc:
        logger.error("cannot start: %s", exc)
        return EXIT_CONFIG
    try:
        spark = build_spark(config, iceberg=spark_catalog)
    except (SparkJarsError, SparkUnavailable) as exc:
        logger.error("cannot start: %s", exc)
        return EXIT_CONFIG
    metrics = setup_metrics(config.metrics, config.sink_id, "")
    log = open_txnlog(config, "maintain", lock_timeout=LEASE_WAIT)
    health = Health()
    try:
        maintainer = Maintainer(
            config, spark, name, open_catalog(config), log, metrics, command_owner("maintain"), stop=stop
        )
        if not once:
            if config.health.port is not None:
                health.serve(config.health.host, config.health.port)
            # /healthz answers while the process lives; /readyz once a pass has finished.
            maintainer.run_forever(
                on_pass=lambda: health.set_ready(state="maintaining", last_pass=time.time())
            )
            return EXIT_OK
        runs = maintainer.run_once(force=True)
    except ConfigError as exc:  # a catalog the maintainer can't serve (service.iceberg.tables.open_catalog)
        logger.error("cannot start: %s", exc)
        return EXIT_CONFIG
    except Fenced as exc:
        metrics.fenced.add(1, metrics.attrs())
        logger.error("stopping: a newer maintainer took over (%s); this one committed nothing more", exc)
        return EXIT_FENCED
    except Exception as exc:  # the catalog or the txnlog unreachable before any table was looked at
        logger.error("maintenance failed: %s", brief(exc))
        return EXIT_FAILED
    finally:
        health.close()
        log.close()
        spark.stop()
    print(json.dumps({"sink_id": config.sink_id, "tables": [r.to_json() for r in runs]}, indent=2))
    return EXIT_FAILED if any(r.failed for r in runs) else EXIT_OK
