"""The health probes on rsd's HTTP listener: ``/healthz`` says the process serves, and
``/readyz`` whether this node can do its job now, 503 with a one-line reason otherwise;
neither needs a token where a tokens file makes the API need one, and neither says more
than that.

On a node alone: live and ready; then a change held past ``Policy.UNREADY_WAIT_SECONDS``
(a second here: a test-only flag lowers it) for its fsync (a failpoint holds the fsync
while a file exists: no timing decides what is seen) makes it unready, still live, and
ready again once the fsync goes through. On a cluster (one etcd, three nodes in turn): a
primary under ``--fsync always`` is unready while it has no synchronous standby; a
standby refused the stream (no cluster token) is joining; a standby that caught up is
ready, and so is its primary; once that standby stops, the primary is unready again. The
standby's states a cluster shows only under a timing (an older epoch's copy, a closed
stream, batches behind) are the follower's rule, checked on its own. (A write or fsync
that fails ends rsd, exit 74: test_durability.py; a probe then gets no answer at all.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from support.cluster import kill_all, node_args, primary
from support.etcd import EtcdCluster
from support.http import http
from support.process import Rsd

from rsclient import AsyncRunstate
from rsd.cli import parse_args
from rsd.options import TEST_ONLY_ENVIRONMENT
from rsd.policy import Policy
from rsd.replication.follower import Follower, Standby
from rsd.security.tokens import hash_token, new_token

OPS = new_token()
LEASE = "10"  # --cluster-lease-seconds: no takeover is tested; a loaded machine keeps it
POLLS = 600  # x 0.1 s: a bound on waiting for a state, never a timing asserted
# A change held this long makes the node alone unready (Policy.UNREADY_WAIT_SECONDS, 5 s,
# lowered by a test-only flag): the held fsync is waited out for a second, not 5. Nothing
# else is in flight when the node is probed ready, so no healthy fsync meets it.
UNREADY_WAIT = 1.0
UNREADY_SOONER = ("--test-unready-wait-seconds", f"{UNREADY_WAIT:g}")


async def probe(port: int, path: str) -> tuple[int, Any]:
    return await http(port, "GET", path)


async def until(port: int, status: int) -> Any:
    """/readyz's body once it answers ``status``."""
    seen: tuple[int, Any] = (0, None)
    for _ in range(POLLS):
        seen = await probe(port, "/readyz")
        if seen[0] == status:
            return seen[1]
        await asyncio.sleep(0.1)
    raise AssertionError(f"/readyz never answered {status}: last {seen}")


async def wait_for_file(path: Path) -> None:
    for _ in range(POLLS):
        if path.exists():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never appeared: the held fsync was not reached")


def test_a_standby_is_ready_once_it_holds_what_its_primary_had_when_its_stream_began(
    tmp_path: Path,
) -> None:
    """The standby's side of the rule, each state in turn (the ones a cluster shows
    only under a timing: a copy of an older epoch, a closed stream, a standby behind)."""
    follower = Follower(tmp_path, None, cluster="c", node="n", token=None)
    assert follower.unready() == "joining: no copy of the primary's state yet"
    nothing = cast(Any, None)  # the core and its files: not read by the rule
    follower.standby = Standby(nothing, nothing, nothing, epoch=3, last=10)
    follower.known_epoch = 4  # etcd says a new primary leads: its copy is on its way
    assert follower.unready() == "standby holds the state of epoch 3, the cluster is at epoch 4"
    follower.known_epoch = 3
    assert follower.unready() == "standby not following a primary"
    follower.streaming, follower.primary_had = True, 22  # the HELLO reply's ``written``
    assert follower.unready() == "standby 12 batches behind its primary"
    follower.standby.last = 22
    assert follower.unready() is None
    follower.standby = None  # (nothing to close)


def test_only_rsds_own_tests_may_make_a_node_unready_sooner(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """``--test-unready-wait-seconds`` is a test-only option (refused without
    RSD_TEST_ONLY_OPTIONS=1, as every such option is): it only lowers the wait."""
    flag, variable = UNREADY_SOONER[0], TEST_ONLY_ENVIRONMENT[0]
    monkeypatch.delenv(variable, raising=False)
    with pytest.raises(SystemExit):
        parse_args(list(UNREADY_SOONER))
    assert f"argument {flag}: is for rsd's own tests only" in capsys.readouterr().err
    monkeypatch.setenv(variable, TEST_ONLY_ENVIRONMENT[1])
    assert parse_args([]).unready_wait_seconds == Policy.UNREADY_WAIT_SECONDS
    assert parse_args(list(UNREADY_SOONER)).unready_wait_seconds == UNREADY_WAIT
    with pytest.raises(SystemExit):
        parse_args([flag, "6"])
    assert f"argument {flag}: must be a number of seconds greater than 0 and at most 5" in (
        capsys.readouterr().err)


async def test_a_node_alone_is_unready_while_a_change_waits_for_its_fsync(
    rsds: Callable[..., Rsd], tmp_path: Path,
) -> None:
    hold = tmp_path / "hold-fsync"
    rsd = rsds()
    tokens = rsd.write_tokens(f"{hash_token(OPS)} ops admin")
    await rsd.start("--tokens-file", str(tokens), "--http-listen", "127.0.0.1:0",
                    "--fsync", "always", *UNREADY_SOONER, failpoints="journal.fsync.hold",
                    env={"RSD_FAILPOINTS_HOLD_FILE": str(hold)})
    port = rsd.metrics_port()
    assert await probe(port, "/healthz") == (200, {"ok": True})
    assert await probe(port, "/readyz") == (200, {"ready": True})
    assert await http(port, "HEAD", "/readyz") == (200, "")  # the head alone
    assert (await http(port, "POST", "/readyz"))[0] == 405
    assert (await probe(port, "/api/overview"))[0] == 401  # the API still needs a token

    async with AsyncRunstate(holder="writer", address=rsd.address, token=OPS) as rs:
        run = await rs.scopes.create()
        await rs.mailboxes.ensure("jobs")
        hold.touch()
        submit = asyncio.ensure_future(run.mailbox("jobs").submit({"n": 1}, key="k"))
        await wait_for_file(Path(f"{hold}.reached"))  # its fsync is held now
        unready = await until(port, 503)
        assert set(unready) == {"ready", "reason"} and unready["ready"] is False
        assert unready["reason"].startswith("changes waiting "), unready
        assert unready["reason"].endswith(" s for the journal fsync"), unready
        assert await probe(port, "/healthz") == (200, {"ok": True})  # it still serves
        hold.unlink()
        assert (await submit).created
        assert await until(port, 200) == {"ready": True}
    assert await rsd.stop() == 0


async def test_a_primary_and_a_standby_are_ready_once_the_standby_has_caught_up(
    rsds: Callable[..., Rsd], etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    etcd = etcd_cluster(1)
    nodes = [rsds(f"n{i}") for i in range(3)]

    async def start(i: int, cluster_token: bool) -> int:
        node = nodes[i]
        tokens = node.write_tokens(f"{hash_token(OPS)} ops admin")
        extra = ["--tokens-file", str(tokens), "--http-listen", "127.0.0.1:0"]
        if cluster_token:
            path = node.root / "cluster-token"
            path.write_text(OPS)
            extra += ["--cluster-token-file", str(path)]
        await node.start(*node_args(etcd, f"n{i}", LEASE, "probes"), *extra)
        return node.metrics_port()

    try:
        first = await start(0, cluster_token=True)
        _, client, _ = await primary(nodes[:1])
        await client.close()
        alone = await probe(first, "/readyz")  # no standby: nothing can be acknowledged
        assert alone == (503, {"ready": False, "reason": "primary without a synchronous "
                               "standby: no change can be acknowledged"}), alone
        assert await probe(first, "/healthz") == (200, {"ok": True})

        refused = await start(1, cluster_token=False)  # the primary refuses its stream
        assert await probe(refused, "/readyz") == (
            503, {"ready": False, "reason": "joining: no copy of the primary's state yet"})
        assert await probe(refused, "/healthz") == (200, {"ok": True})

        standby = await start(2, cluster_token=True)
        assert await until(standby, 200) == {"ready": True}
        assert await until(first, 200) == {"ready": True}
        assert (await probe(standby, "/api/overview"))[0] == 401  # the API needs a token
        assert (await probe(refused, "/readyz"))[0] == 503

        assert await nodes[2].stop() == 0  # the synchronous standby leaves
        gone = await until(first, 503)
        assert gone["reason"].startswith("primary without a synchronous standby"), gone
    finally:
        await kill_all(nodes)
