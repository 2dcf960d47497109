"""The core's state as one whole: the shared tables that register every run, tenant
and lease (``tables.py``), the one path by which state changes (``Tables.commit``), the
named events by which one part's change reaches another (``events.py``), and what every
admin op reads first (``adminargs.py``). The rules that change state are in the floors
above: ``holds``, ``work``, ``runs``.
"""
