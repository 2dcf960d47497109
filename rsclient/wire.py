"""The wire protocol as the SDK sees it: a re-export of ``rsproto``, the one codec."""

from rsproto import *  # noqa: F403
from rsproto import __all__  # noqa: F401
