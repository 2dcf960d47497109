"""The core's ground floor: the mechanisms every rule stands on, knowing no object they serve.

Errors and effects (what a call refuses or produces), the timer wheel and the wall clock
kept beside it, lines of dues, paged indexes, argument checks, tenants and their limits,
ids, leases, parked waits, payloads and the shapes of batched calls. Nothing here imports
a floor above it (tests/test_no_package_imports_one_above_it.py holds the order).
"""
