"""One table's batch, start to plan: decode → last change per key → files → a :class:`TableWrite`.

The job (``service.job``) owns the stream, the cadence and the commit; it hands a batch's Kafka rows
to a :class:`~service.pipeline.table.TablePipeline` and gets back one
:class:`~service.pipeline.result.TableWrite`, which becomes the plan the committer lands
(``service.commit``). The schema a table's events carry is followed by
:class:`~service.pipeline.schemas.SchemaTracker`.
"""
