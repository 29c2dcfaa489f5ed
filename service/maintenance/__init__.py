"""Table health: fenced maintenance of the sink's tables (``icesink maintain``, docs/operations.md)."""
