"""Kafka plumbing: record codec, consumer, producer and the embedded tansu broker."""
