"""The service side: the daemon's collaborators, each one concern (docs/architecture.md).

``session`` (Kafka clients, topics, back-off), ``partitions`` + ``ledger`` (where partitions
resume, what was learned, per log epoch: no Kafka), ``processor`` (records in, a typed batch
outcome out: no Kafka, no metrics), ``predictions`` + ``outbox`` (what is published and what
came back acknowledged), ``checkpointer`` + ``checkpoint`` (snapshot cadence, store, naming,
single writer, commits that follow durable state), ``telemetry`` (every metric, as hooks),
``hooks`` (named points; fault injection subscribes). The library core never imports this
package; ``daemon.Daemon`` composes it.
"""
