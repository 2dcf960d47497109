import gc
import sys

# The collector is off while the server's modules load: they make classes, functions and
# tables that live as long as the process, not garbage, and the collections their
# allocations set off walked them all again; then they are frozen (``gc.freeze``: moved
# where no collection looks), so neither the first collection after the imports nor any
# later one walks them (5 % of a start's CPU, paid at every start of rsd;
# tests/test_a_plain_start_imports_only_what_it_uses.py). On again before rsd runs.
gc.disable()
from .cli import main  # noqa: E402

gc.freeze()
gc.enable()
sys.exit(main())
