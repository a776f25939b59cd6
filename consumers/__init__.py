"""Kafka I/O for rankwatch (kafka-python): consumer groups, offsets, rebalances, dead letters."""
