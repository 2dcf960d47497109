"""The HTTP listener (``--http-listen``): h11 on rsd's own loop (``httpserver.py``), who
holds its places (``httpplaces.py``), and what it serves: ``/metrics``
(``metricshttp.py``), the dashboard (``dashboard.py``; its files stay in ``rsd/static/``,
package data), its JSON API (``api.py``) and the minutes of history it charts
(``history.py``).
"""
