"""Tracing costs nothing unless asked for (rsclient/tracing.py): a process that never
imported OpenTelemetry's API makes clients without importing it (no provider can have been
set there) and their task path tests one attribute, None; once the process has set a
provider, a client made afterwards traces. In a child process: the test's own imports
(the in-memory exporter's) would otherwise be in ``sys.modules`` already."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from rsclient import AsyncRunstate

plain = AsyncRunstate(holder="plain", address="127.0.0.1:1")
print(plain._session.spans is None, "opentelemetry" in sys.modules)
from opentelemetry import trace
print(AsyncRunstate(holder="still", address="127.0.0.1:1")._session.spans is None)
from opentelemetry.sdk.trace import TracerProvider
trace.set_tracer_provider(TracerProvider())
print(AsyncRunstate(holder="traced", address="127.0.0.1:1")._session.spans is not None)
"""


def test_no_provider_no_import_and_a_provider_set_is_used(child_env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=child_env, capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.split() == ["True", "False", "True", "True"], done.stderr
