"""``python -m rsctl``."""

from .main import _entry

_entry()
