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
