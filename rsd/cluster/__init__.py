"""High availability, the etcd side: which rsd node is primary, decided by etcd.

etcd holds what the nodes must agree on and nothing else (``etcd.py``); the journal stays
rsd's. One module per concept:

- ``options.py``: the settings in plain Python (endpoints, names, TLS, their check); no
  gRPC is loaded by importing it, so the server may check options without etcd;
- ``client.py``: the gRPC channel to etcd (every member's address, keepalive pings, a
  deadline on every call, TLS); ``EtcdError``, the one failure the rest sees;
- ``etcd.py``: ``EtcdStore``, a shard's keys (leader, epoch, sync, members; the default
  shard's under ``/rsd/<cluster>/``, shard NAME's under ``/rsd/<cluster>/shards/NAME/``),
  the campaign, the guarded writes of a leader, the lease and its deadline, a watch that
  outlives a member's failure;
- ``slotmap.py``: ``SlotMapStore``, the cluster's slot map (``/rsd/<cluster>/slotmap``):
  made once, watched with every shard's primary, switched by compare-and-swap;
- ``elector.py``: ``Elector``, the asyncio component the server owns: keeps the lease,
  campaigns when allowed, and tells the server ``on_primary`` / ``on_standby`` /
  ``on_lost``; ``is_primary`` is the synchronous check before every act of a primary.

Nothing here imports the server, and the server needs none of it without ``--etcd``.
Importing ``etcd.py`` or ``elector.py`` loads aetcd and gRPC.

gRPC's fork handlers are turned off here, before any module of this package can load
gRPC: rsd forks writers (a snapshot, a standby's copy) that never call gRPC and leave
with ``os._exit``, and with the handlers on, a child forked while gRPC's threads were
busy crashed (SIGSEGV, or a failed check and SIGABRT) in about 2 % of forks beside a
live channel, so a standby lost its copy and a snapshot was not written.
``tests/test_a_writer_forked_beside_the_etcd_client_does_not_crash.py``.
"""

import os

# Read by gRPC when it loads; set whatever the environment said (rsd's children never
# call gRPC, so its fork handlers can only do harm).
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"
