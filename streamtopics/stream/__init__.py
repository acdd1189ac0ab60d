"""Kafka plumbing: the record codec (wire formats), the batching consumer and the producer.
The bundled broker runner lives in ``streamtopics.testing``."""
