"""A run's own state: the run (``scope.py``, keyed ``(tenant, run id)``) and what lives in
it: claims, items (tasks and messages, with the one table of their states: ``items.py``),
queues and their ready lanes, counts by state (``tally.py``), groups and schedules.

This is the state a shard will own whole. It imports only the floors below it (records,
ground, tenant), never the tables that register every run (``state``). Inside it, a run
and its groups and schedules know each other (``Scope.groups``, ``Group.scope``): the
one import circle of more than two modules left, named in
tests/test_no_package_imports_one_above_it.py.
"""
