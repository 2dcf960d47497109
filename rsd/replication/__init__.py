"""A standby's side of replication, and a cluster node's two roles.

``follower.py`` follows a primary's journal into a hot standby; ``node.py`` is one node
of a cluster, a standby or the primary as etcd decides (``rsd/cluster/``, the etcd side).
The primary's side, each standby's feed, is on the wire (``rsd/wire/feeds.py``).
"""
