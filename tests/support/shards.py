"""Sharded clusters in the tests: whether the rsd of this tree takes ``--shard`` (issue 32's
server side; the tests of the etcd side that need real shards run once it does)."""

from __future__ import annotations

import functools
import subprocess
import sys

from .process import REPO, subprocess_env

__all__ = ["shards_supported"]


@functools.cache
def shards_supported() -> bool:
    """Whether ``rsd --help`` names ``--shard``."""
    shown = subprocess.run([sys.executable, "-m", "rsd", "--help"], capture_output=True,
                           text=True, cwd=REPO, env=subprocess_env(), check=False)
    return "--shard" in shown.stdout
