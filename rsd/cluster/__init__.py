"""High availability, the etcd side: which rsd node is primary, decided by etcd.

etcd holds what the nodes must agree on and nothing else (``etcd.py``); the journal stays
rsd's. One module per concept:

- ``options.py``: the settings in plain Python (endpoints, names, TLS, their check); no
  gRPC is loaded by importing it, so the server may check options without etcd;
- ``client.py``: the gRPC channel to etcd (every member's address, keepalive pings, a
  deadline on every call, TLS); ``EtcdError``, the one failure the rest sees;
- ``etcd.py``: ``EtcdStore``, rsd's keys under ``/rsd/<cluster>/`` (leader, epoch, sync,
  members), the campaign, the guarded writes of a leader, the lease and its deadline, a
  watch that outlives a member's failure;
- ``elector.py``: ``Elector``, the asyncio component the server owns: keeps the lease,
  campaigns when allowed, and tells the server ``on_primary`` / ``on_standby`` /
  ``on_lost``; ``is_primary`` is the synchronous check before every act of a primary.

Nothing here imports the server, and the server needs none of it without ``--etcd``.
Importing ``etcd.py`` or ``elector.py`` loads aetcd and gRPC.
"""

import os

# rsd forks children (the snapshot writer, a standby's copy) while gRPC's threads are
# busy with etcd. gRPC's own fork handlers then skip themselves ("Other threads are
# currently calling into gRPC, skipping fork() handlers") yet still start gRPC threads in
# the child, which abort on the poller's state they inherited ("Check failed:
# next_worker->state == KICKED"): with grpcio 1.85, about half of a cluster node's
# snapshots and standby copies failed so. The children use no gRPC: with fork support
# off gRPC does nothing at a fork. Read when gRPC loads, so set before any import of it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
