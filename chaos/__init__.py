"""Fault injection for metaq-py: a Toxiproxy-API proxy, histories, and the checker.

* ``chaos.proxy``            the asyncio TCP fault proxy speaking Toxiproxy's HTTP API (running it);
                             ``chaos.toxics``, ``chaos.proxy_link`` (data path), ``chaos.proxy_api`` (HTTP)
* ``chaos.toxiproxy_client`` which proxy server to use, and a toxiproxy-python client for it
* ``chaos.history``          the recorded history of a run (operations, faults, log snapshots)
* ``chaos.checker``          checks a history for safety and liveness; ``chaos.anomalies`` the
                             Kafka workload's anomaly set (Jepsen's names)
* ``chaos.group_consumer``   the consumer-group workload: consumer processes, killed and restarted
* ``chaos.cluster``, ``chaos.scenarios``, ``chaos.runner``  the topology (optionally secured),
                             the faults, and ``python -m chaos run``
* ``chaos.hosts``            ``--hosts netns``: each ZooKeeper node and broker in a network namespace
                             on one bridge; silent link-down and nftables cuts
* ``chaos.rogue``            hostile peers (forged replication requests, heartbeats, ZooKeeper
                             writes); ``chaos.hostile`` runs them for ``--rogue`` and watches RSS
* ``chaos.campaign``         ``python -m chaos campaign``: many random runs, each stored as a row;
                             ``python -m chaos campaign-table`` writes their table again

``python -m chaos proxy`` runs the proxy; see docs/chaos.md.
"""
