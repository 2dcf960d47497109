"""Sync schedules: ``run.schedules`` (``ensure``, ``list``, ``page``, ``get``, ``pause``,
``resume``, ``delete``), derived from ``rsclient.schedules`` (``_derive.py``): every rule
is the async client's, run on the client's loop thread."""

from __future__ import annotations

from .. import schedules as aschedules
from ._derive import Handle, blocking

__all__ = ["Schedules"]


class Schedules(Handle[aschedules.Schedules]):
    """``run.schedules``: the schedules of one run, for sync code."""

    def __repr__(self) -> str:
        return f"<sync Schedules of {self._async.scope}>"

    ensure = blocking(aschedules.Schedules.ensure)
    list = blocking(aschedules.Schedules.list)
    page = blocking(aschedules.Schedules.page)
    get = blocking(aschedules.Schedules.get)
    pause = blocking(aschedules.Schedules.pause)
    resume = blocking(aschedules.Schedules.resume)
    delete = blocking(aschedules.Schedules.delete)
