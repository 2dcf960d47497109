import gc
import sys

# The collector is off while the server's modules load: they make classes, functions and
# tables that live as long as the process, not garbage, and the collections their
# allocations set off walked them all again. Then they are frozen (``gc.freeze``: moved
# where no collection looks), as everything recovery builds is (collector.py's
# ``frozen_when_done``, written out here: importing collector.py would load asyncio with
# the collector on), so the first collection after the imports does not walk them either.
# 3 % of a start's CPU, paid at every ``python -m rsd`` (each rsd the Python tests start;
# tests/test_a_plain_start_imports_only_what_it_uses.py). On again before rsd runs.
gc.disable()
from .cli import main  # noqa: E402

gc.freeze()
gc.enable()
sys.exit(main())
