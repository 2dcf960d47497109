"""rsd starts one way, with or without ``--etcd`` (rsd/cli.py: the cluster is an option of
the one start, rsd/clustermode.py its part): a node of a cluster refuses a file named by
its options that it cannot read before it touches its data directory (exit 2), logs
what it recovered, refuses a data directory it cannot read with exit 2 naming it, and
stops (exit 74) when its data directory is removed under it, exactly as one rsd alone
does. Before, the cluster's start was a near-copy of its own: it made and locked its
data directory before it read its cluster token file, exited 1 on a directory it could
not read ("cannot use the data directory"), logged nothing of its recovery, and went on
running in a removed directory.

Real processes: the rule is about the process's start. A node needs no etcd for any of
this (it reads its directory before it reaches etcd, and waits for etcd as long as it
takes), so it is given an address where nothing answers.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator

import pytest
from support.process import Rsd, refusing_address

from rsd.disk.journal import EXIT_IO_ERROR

EXIT_REFUSED = 2  # a bad option, or a damaged directory (docs/durability.md), naming the file


@pytest.fixture(params=["alone", "node"])
def how(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """The extra flags of each kind of start: none, or a cluster's (etcd never answers)."""
    if request.param == "alone":
        yield []
        return
    with refusing_address() as nowhere:
        yield ["--etcd", nowhere, "--cluster", "c", "--node", "n1"]


async def test_a_file_the_options_name_that_cannot_be_read_is_refused_first(
    rsds: Callable[..., Rsd], how: list[str],
) -> None:
    server = rsds()
    missing = server.root / "missing"
    named = ["--cluster-token-file" if how else "--tokens-file", str(missing)]
    assert await server.refused(*how, *named) == EXIT_REFUSED, server.log()
    assert str(missing) in server.log(), server.log()
    assert not server.data.exists()  # nothing touched


async def test_a_directory_that_cannot_be_read_is_refused_with_exit_2(
    rsds: Callable[..., Rsd], how: list[str],
) -> None:
    server = rsds()
    server.data.mkdir(parents=True)
    for seq in (1, 2):  # damage before the last segment: not a torn tail
        (server.data / f"journal-{seq:016x}.log").write_bytes(b"not a journal" * 10)
    assert await server.refused(*how) == EXIT_REFUSED, server.log()
    log = server.log()
    assert f"cannot recover from {server.data}: " in log, log
    assert "journal-0000000000000001.log: not an rsd RSDJ file" in log, log


async def test_recovery_is_logged_and_a_removed_directory_stops_it(
    rsds: Callable[..., Rsd], how: list[str],
) -> None:
    server = rsds()
    await server.start(*how)
    assert "recovered in " in server.log(), server.log()
    shutil.rmtree(server.data)
    assert await server.exited(15) == EXIT_IO_ERROR, server.log()
    assert f"data directory {server.data} is gone" in server.log()
