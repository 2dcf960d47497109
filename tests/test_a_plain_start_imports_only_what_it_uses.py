"""A plain start of rsd (one node alone: no config file, no HTTP listener, no cluster)
imports only what it uses, and loads its modules with the garbage collector off.

Every start of rsd pays for each module it imports: about 0.15 s of CPU a start, nine
tenths of it imports, and a test run starts rsd some 500 times (the Python suite's and the
TypeScript SDK's tests). So what only some starts use is imported where it is used: the
config file's TOML parser and its key suggestions (options.py, ``read_config``), the HTTP
listener (cli.py, ``_listen``), the cluster's etcd client (cli.py, ``ClusterMode``); and
``python -m rsd`` loads the server's modules with the collector off (__main__.py: they
make objects that live as long as the process, which each collection set off by their
allocations walked again), on again before rsd runs.

The start is a real one, through ``runpy`` as ``python -m rsd`` runs it; at its exit it
writes the modules it imported and whether the collector is on."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.process import READY_TIMEOUT, REPO, STOP_TIMEOUT, subprocess_env

# What a plain start must not import, and the starts that use it.
NOT_ON_A_PLAIN_START = {
    "tomllib": "a start with --config (options.read_config)",
    "difflib": "a config file with a misspelt key (options.read_config)",
    "importlib.metadata": "none: rsproto reads the version from the dist-info itself",
    "h11": "a start with --http-listen (rsd/http)",
    "rsd.http.httpserver": "a start with --http-listen",
    "rsd.http.dashboard": "a start with --http-listen",
    "rsd.clustermode": "a node of a cluster (--etcd)",
    "rsd.cluster.etcd": "a node of a cluster (--etcd)",
    "grpc": "a node of a cluster: the etcd client",
    "aetcd": "a node of a cluster: the etcd client",
    "google.protobuf": "a node of a cluster: the etcd client",
}

# ``python -m rsd`` with the given arguments; at exit, what it imported and the collector.
_START = """
import atexit, gc, json, runpy, sys
report_path = sys.argv[1]
def _report():
    with open(report_path, "w") as out:
        json.dump({"modules": sorted(sys.modules), "collector_on": gc.isenabled()}, out)
atexit.register(_report)
sys.argv = ["rsd", *sys.argv[2:]]
runpy.run_module("rsd", run_name="__main__", alter_sys=True)
"""


def _plain_start(tmp_path: Path) -> dict[str, Any]:
    """Start rsd alone on a new data directory, stop it with SIGTERM (exit 0): its report."""
    report = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", _START, str(report), "--listen", "127.0.0.1:0",
         "--data-dir", str(tmp_path / "data"), "--handshake-timeout", "1"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=REPO, env=subprocess_env())
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the ready line (EOF if the start failed)
        assert line.startswith(b"rsd listening on "), (line, proc.stderr and proc.stderr.read())
        proc.send_signal(signal.SIGTERM)
        _, errors = proc.communicate(timeout=READY_TIMEOUT + STOP_TIMEOUT)
        assert proc.returncode == 0, errors.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    loaded: dict[str, Any] = json.loads(report.read_text())
    return loaded


def test_a_plain_start_imports_none_of_what_only_other_starts_use(tmp_path: Path) -> None:
    report = _plain_start(tmp_path)
    modules = set(report["modules"])
    assert "rsd.server" in modules and "rsd.cli" in modules  # it did start
    imported = {name: why for name, why in NOT_ON_A_PLAIN_START.items()
                if any(module == name or module.startswith(name + ".")
                       for module in modules)}
    assert imported == {}, "a plain start imported what only these starts use"
    assert report["collector_on"] is True, "the collector was left off after the imports"
