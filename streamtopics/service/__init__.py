"""The service side (Kafka composition) in small modules: ``ledger`` (learned offsets per
partition and epoch), ``checkpoint`` (snapshot store, naming, the single-writer lock, commits
that follow durable state). The library core never imports this package."""
