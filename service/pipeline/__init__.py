"""The sink's batch steps, each in its own module with one result, in the order a batch takes them.

``read`` (a :class:`~service.pipeline.read.Batch`) → ``batches`` (written now, or buffered by the
cadence) → ``write`` (each table's :class:`~service.pipeline.table.TablePipeline` gives a
:class:`~service.pipeline.result.TableWrite`) → one :class:`~service.pipeline.outcome.BatchOutcome`
→ ``commit`` (the plan, :mod:`service.commit`, and the report). ``positions`` owns every offset rule,
``startup`` what happens between the claim and the stream. docs/architecture.md draws it.
"""
