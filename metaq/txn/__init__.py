"""Idempotent producers and transactions (local and XA), kept in the replicated log.

Modules, lowest first (none imports the broker, HA or client layers):

* ``control``  the control-record codec: the bytes of batch headers and markers
* ``producer_state``  per-partition dedup table (last N batches per producer)
* ``index``  per-partition transaction index: open transactions, LSO, aborted spans
* ``rebuild``  rebuilds both from a log walk, and their snapshot file
* ``put``  the put handler's step: refuse forged control records, dedup, frame
* ``reader``  the pure consumer-side filter over fetched bytes
* ``xa``  the XA branch state machine (pure transition table)
* ``txlog``  the broker's transaction journal with checkpoints and flush modes
* ``coordinator``  branches, timeouts, markers to write, reconcile at start/promotion
* ``crcfile``  small CRC-guarded state files, replaced atomically
* ``config``  the MetaQ transaction settings from server.ini

docs/transactions.md is the design; its "Wiring contract" says what the broker,
HA promotion and the client must call.
"""
