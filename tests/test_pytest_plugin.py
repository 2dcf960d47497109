"""The pytest plugin gives a user's own tests a real rsd: ``async def test_x(run)``.

A user's test file is run by pytester with nothing but the installed plugin (no
conftest of ours): its fixtures start a real server, give a connected client and a fresh
run per test; ``RsdServer`` restarts on the same address and data directory.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rsclient import AsyncRunstate, ConflictError
from rsclient.testing import RsdServer, rsd_command

USER_TESTS = '''
import pytest
from rsclient import ConflictError

async def test_a_claim_is_exclusive(run):
    lease = await run.claim("company:acme").acquire()
    with pytest.raises(ConflictError):
        await run.claim("company:acme").acquire()
    await lease.release()

async def test_each_test_gets_a_fresh_run(run, runstate, rsd_server):
    assert rsd_server.address == runstate.address
    attempt = await run.claim("company:acme").try_acquire()
    assert attempt["kind"] == "acquired"
    await attempt["lease"].release()
'''


def test_a_users_tests_run_against_a_real_rsd_through_the_plugin(pytester: Any) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    pytester.makeini("[pytest]\nasyncio_mode = auto\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_rsd_is_found_next_to_the_interpreter() -> None:
    command = rsd_command()
    assert command[0].endswith("rsd") or command[1:] == ["-m", "rsd"]


def test_a_restarted_server_keeps_its_address_and_data() -> None:
    with RsdServer() as server:
        address = server.address

        async def hold() -> str:
            async with AsyncRunstate(holder="a", address=address) as rs:
                run = await rs.scopes.create()
                lease = await run.claim("k").acquire()
                await asyncio.to_thread(server.kill)
                assert await asyncio.to_thread(server.restart) == address
                await lease.renew()  # the same lease, on the restarted server
                try:
                    await run.claim("k").acquire()
                except ConflictError:
                    pass
                else:
                    raise AssertionError("the claim was free after the restart")
                await lease.release()
                return run.id

        asyncio.run(hold())
