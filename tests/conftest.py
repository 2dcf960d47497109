"""Fixtures for the integration tests, built on ``tests/support`` (nothing imports this).

- ``rsd``: one server per test on a free port, with a 1 s handshake timeout. At teardown
  it gets SIGTERM and must exit 0 within a few seconds, and its logs must hold no
  traceback. The next test's server is started while this one runs, so a fresh server
  per test costs no start-up wait.
- ``@pytest.mark.rsd_per_module`` on a module (``pytestmark``), or on some of its tests:
  their ``rsd`` is one server for the whole module, for tests that cannot see each other
  (each works in runs of its own, under names that mean the same in every test): a start
  (0.2 s of CPU) per test saved. It is stopped, and its logs checked, after the module's
  last test.
- ``rsd_factory``: ``start(*extra_args)``, more servers of this test's own (each with its
  own data directory) for tests that pause or break one; torn down the same way.
- ``rsds``: ``make(name)``, an ``Rsd`` not yet started, for tests that start, crash and
  restart it themselves (a restart keeps the port the first start reported); killed at
  teardown, its logs checked likewise.
- ``restartable``: a started ``Rsd``; clients find it again after
  ``await restartable.stop(); await restartable.start()``; must exit 0 at teardown.
- ``clients``: ``make(holder, address=None)`` builds an ``AsyncRunstate`` closed at teardown.
- ``child_env``: the environment for helper processes (repo importable, unbuffered).
- ``eventually``: ``await eventually(check)`` polls an async predicate until it holds.
- ``raw_connect``: ``await raw_connect(address, tls=None)`` opens a ``RawConn``
  (support/raw.py), closed at teardown.
- ``etcd_cluster``: ``start(size=3, certs=None)``, an etcd cluster of this test's own on
  loopback (support/etcd.py), every member stopped at teardown.

Where the environment forbids writing bytecode, the workers and every child process keep
theirs in build/pycache instead (support/process.py, ``bytecode_cache``).

The header names the build under test (compiled by mypyc, or pure Python: support/build.py);
a run on compiled modules older than their sources stops at once (``make`` rebuilds them).

At the end of a run that fuzzed (support/fuzz.py), one line sums up what the fuzz tests
fed: inputs, connections, unhandled exceptions, refusals by error code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import aio, build, fuzz, raw
from support.certs import Certs
from support.etcd import EtcdCluster
from support.process import Rsd, bytecode_cache, subprocess_env

from rsclient import AsyncRunstate


class _Spare:
    """One rsd started ahead of need, so a test gets a fresh server without waiting for
    Python to start: each test still has a server (and data directory) of its own."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.next: Rsd | None = None

    def _spawn(self) -> Rsd:
        server = Rsd(self.factory.mktemp("rsd"))
        server.spawn()
        return server

    def take(self) -> Rsd:
        server = self.next or self._spawn()
        self.next = self._spawn()
        server.ready()
        return server

    def close(self) -> None:
        if self.next is not None:
            self.next.stop_now()
            self.next = None


@pytest.fixture(scope="session")
def _rsd_spare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Spare]:
    spare = _Spare(tmp_path_factory)
    yield spare
    spare.close()


@pytest.fixture
def rsd_factory(_rsd_spare: _Spare, tmp_path: Path) -> Iterator[Callable[..., Rsd]]:
    """``start(*extra_args)``: another rsd of this test's own, stopped at teardown."""
    started: list[Rsd] = []

    def start(*extra: str) -> Rsd:
        if extra:
            server = Rsd(tmp_path / f"rsd{len(started)}")
            server.start_now(*extra)
        else:
            server = _rsd_spare.take()
        started.append(server)
        return server

    yield start
    _stop_and_check(started)


def _stop_and_check(servers: list[Rsd]) -> None:
    """SIGTERM each server: it must exit 0, and its logs must hold no traceback."""
    problems = []
    for server in servers:
        code = server.stop_now()
        if code != 0:
            problems.append(f"{server}: exit code {code} after SIGTERM (None = had to kill)")
        problems.extend(f"{server} logged a traceback in {text}" for text in server.tracebacks())
    if problems:
        pytest.fail("\n".join(problems))


@pytest.fixture(scope="module")
def _module_rsd(_rsd_spare: _Spare) -> Iterator[Rsd]:
    """The ``rsd`` of every test of an ``rsd_per_module`` module."""
    server = _rsd_spare.take()
    yield server
    _stop_and_check([server])


@pytest.fixture
def rsd(request: pytest.FixtureRequest, rsd_factory: Callable[..., Rsd]) -> Rsd:
    """The test's rsd (the one ``clients`` connect to): the spare, or one started with the
    flags of the test's ``rsd_flags`` mark (``@pytest.mark.rsd_flags(*SHORT_LEASES)``), or
    its module's (``rsd_per_module``)."""
    mark = request.node.get_closest_marker("rsd_flags")
    if mark is None and request.node.get_closest_marker("rsd_per_module") is not None:
        server: Rsd = request.getfixturevalue("_module_rsd")
        return server
    return rsd_factory(*(mark.args if mark is not None else ()))


@pytest.fixture
async def rsds(tmp_path: Path) -> AsyncIterator[Callable[..., Rsd]]:
    """``make(name)``: an Rsd not yet started; killed at teardown."""
    made: list[Rsd] = []

    def make(name: str = "rsd") -> Rsd:
        server = Rsd(tmp_path / name)
        made.append(server)
        return server

    yield make
    for server in made:
        if server.alive:
            await server.kill()
    problems = [text for server in made for text in server.tracebacks()]
    assert not problems, "rsd logged a traceback in " + "\n".join(problems)


@pytest.fixture
async def restartable(rsds: Callable[..., Rsd]) -> AsyncIterator[Rsd]:
    """A started rsd (restarts keep its port); it must exit 0 at teardown if still running."""
    server = rsds("restartable")
    await server.start()
    yield server
    if server.alive:
        assert await server.stop() == 0


@pytest.fixture
async def clients(rsd: Rsd) -> AsyncIterator[Callable[..., AsyncRunstate]]:
    made: list[AsyncRunstate] = []

    def make(holder: str, address: str | None = None) -> AsyncRunstate:
        client = AsyncRunstate(holder=holder, address=address or rsd.address)
        made.append(client)
        return client

    yield make
    for client in made:
        await aio.close_quietly(client)


@pytest.fixture
def child_env() -> dict[str, str]:
    """The environment for helper processes (see ``support.process.subprocess_env``)."""
    return subprocess_env()


@pytest.fixture
def eventually() -> Callable[..., Awaitable[None]]:
    """``await eventually(check, timeout=5.0)``: poll an async predicate until true."""
    return aio.eventually


@pytest.fixture
async def raw_connect() -> AsyncIterator[Callable[..., Awaitable[raw.RawConn]]]:
    opened: list[raw.RawConn] = []

    async def connect(address: str, tls: ssl.SSLContext | None = None) -> raw.RawConn:
        conn = await raw.raw_connect(address, tls)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.writer.wait_closed(), 2)


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[Callable[..., EtcdCluster]]:
    """``start(size=3, certs=None)``: an etcd cluster of this test's own, healthy."""
    started: list[EtcdCluster] = []

    def start(size: int = 3, certs: Certs | None = None) -> EtcdCluster:
        cluster = EtcdCluster(tmp_path / f"etcd{len(started)}", size, certs)
        started.append(cluster)
        return cluster.start()

    yield start
    for cluster in started:
        cluster.stop()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "rsd_flags(*flags): start the test's ``rsd`` fixture with these flags")
    config.addinivalue_line(
        "markers", "rsd_per_module: the module's tests share one ``rsd`` (runs of their own)")
    config.addinivalue_line(
        "markers", "at_scale: a core rule shown on 50,000 to 100,000 objects (the cost of a "
        "request or an object whatever the state); `make test-pure` leaves it to the "
        "compiled build's run, the same rule's code paths are its other tests'")
    config.addinivalue_line(
        "markers", "image: needs the container image built: `make test` builds it in the "
        "background and names its exit code's file in RSD_TEST_IMAGE_STATUS; run alone, "
        "the test builds it (`make test-image-check`); `make test-python` leaves it out")
    if hasattr(config, "workerinput"):
        return  # the controller checks, once
    # Before pytest-xdist starts its workers (in pytest_sessionstart), which inherit this
    # environment: each worker then reads its test modules' rewritten bytecode (2.5 s to
    # collect the suite) instead of rewriting and compiling every one anew (8.6 s).
    bytecode_cache(os.environ)
    modules = build.imported()
    if any(build.compiled(module) for module in modules.values()) and build.stale():
        pytest.exit(
            f"compiled modules older than their sources: {', '.join(build.stale())}; "
            "`make` rebuilds them (RSD_COMPILE=0 make: none compiled)",
            returncode=4,
        )


def pytest_report_header(config: pytest.Config) -> str:
    modules = build.imported().values()
    done = sum(build.compiled(module) for module in modules)
    return f"rsd build: {done} of {len(modules)} listed modules compiled by mypyc"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In an xdist worker (``make test`` runs ``-n 2``): hand this worker's fuzz totals
    to the controller, which prints the sum."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        tally = fuzz.TALLY
        output["fuzz"] = [tally.inputs, tally.answered, tally.connections, tally.unhandled,
                          dict(tally.refusals)]


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown to a run without xdist
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist's controller: add a finished worker's fuzz totals (``pytest_sessionfinish``)."""
    got = getattr(node, "workeroutput", {}).get("fuzz")
    if got is not None:
        inputs, answered, connections, unhandled, refusals = got
        fuzz.TALLY.add(fuzz.Tally(inputs, answered, connections, unhandled, Counter(refusals)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fuzz totals of this run, if it fuzzed."""
    if fuzz.TALLY.inputs:
        terminalreporter.write_line("fuzz: " + "; ".join(fuzz.TALLY.lines()))
