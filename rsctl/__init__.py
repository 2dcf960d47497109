"""rsctl: the admin command for rsd.

It talks to a running rsd over the protocol with the SDK's connection (``rs.admin``;
an admin token), or reads a data directory offline (``rsctl journal``) with rsd's own
file readers. One module per concept: ``main`` (arguments and dispatch), ``render``
(tables and JSON), ``online`` (the commands that ask a server), ``top`` (the live
view) and ``offline`` (journal verify and dump).
"""

from .main import main

__all__ = ["main"]
