"""Holding things: claims, pool slots and quota amounts, each held by a lease.

The books of claims (``claimbook.py``), concurrency pools (``poolbook.py``) and quotas
(``quotabook.py``); taking capacity all at once (``capacity.py``); fencing checks and
lease renewals, the hot path of every client.
"""
