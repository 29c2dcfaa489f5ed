"""Everything the sink asks of Kafka outside Spark's source: clients, partitions and offsets, the
peek at a topic's first events, the committed offsets' checks and reset, the lag, the dead letters."""
