"""What a tenant's runs share: concurrency pools (``pool.py``), quotas (``quota.py``),
mailbox definitions (``mailbox.py``), and what an item needs of them to start
(``needs.py``). The objects only; their rules are in ``holds`` and ``work``.
"""
