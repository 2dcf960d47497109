"""rsd's core: the pure, deterministic state machine behind the server.

No asyncio, no sockets, no files, no clock reads: every call takes ``now``.
"""

from .ground.effects import DEFERRED
from .ground.errors import CoreError
from .machine import Core
from .records import Rec

__all__ = ["DEFERRED", "Core", "CoreError", "Rec"]
