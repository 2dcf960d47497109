"""rsd: a self-hosted coordination server for fleets of agents and workers."""

from rsproto import __version__

__all__ = ["__version__"]
