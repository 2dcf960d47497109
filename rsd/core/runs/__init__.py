"""Runs: making, cancelling and freeing them, and what belongs to a run as a whole.

Runs (``scopebook.py``, freed once quiet: ``runends.py``), task groups (``groupbook.py``),
schedules (``schedulebook.py``), and a run's cancellation worked through in slices
(``cascade.py``), which ends items through the ``work`` floor below.
"""
