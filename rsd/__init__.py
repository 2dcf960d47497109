"""rsd: a self-hosted coordination server for fleets of agents and workers."""

__version__ = "0.1.0"
