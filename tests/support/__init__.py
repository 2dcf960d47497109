"""What the tests share, apart from the tests themselves.

- ``core``: ``CoreDriver``, the pure core on a fake clock, for every ``test_core_*`` file.
- ``process``: ``Rsd``, a real rsd process (spawn, ready, pause, resume, kill, stop,
  restart) on a data directory of its own.
- ``raw``: ``RawConn``, a bare socket that speaks frames, for what the SDK never sends.
- ``fake``: ``FakeNode``, a scripted node of a fake cluster, for what rsd cannot be made
  to answer at will (NOT_PRIMARY, a step-down between two requests, a lost reply).
- ``shell``: ``Shell``, the server shell in-process on recording transports, for rules
  about loop turns, reads and writes that real sockets would make timing-dependent.
- ``etcd``: ``EtcdCluster``, real etcd members on loopback (kill, pause, resume,
  restart) on a quicker raft clock than etcd's own (``QUICK``), and ``stores``,
  connected ``EtcdStore``s, for the cluster tests.
- ``aio``: async helpers (``eventually``, ``now``, ``stop_task``, ...).

The pytest fixtures built on these live in ``conftest.py``; nothing imports conftest.
"""
