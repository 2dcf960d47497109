"""``--metrics-listen``: a real rsd serves Prometheus text at /metrics that a strict
parser of the exposition format (0.0.4) accepts, whose counters move with the load of a
real client, and whose option is checked like every other; SERVER_STATS carries the
operator's fields (uptime, ops, leases held, tasks by state, queue depths, journal size,
last snapshot, fsync latency)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import socket
from collections.abc import Callable
from typing import Any

import pytest

from rsclient import AsyncRunstate, ConflictError
from rsd.http.httpserver import MAX_CONNECTIONS
from rsd.metrics import MAX_MAILBOX_SERIES
from rsproto import Op
from tests.support.process import Rsd
from tests.support.raw import raw_connect

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? (\S+)$")
_VALUE = re.compile(r"^(?:[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"
                    r"|[+-]Inf|NaN)$")
_SUFFIXES = {"counter": ("",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[dict[str, str], Series]:
    """Parse exposition text strictly: every family has HELP then TYPE once, before its
    samples, which follow it without interruption; names, labels and values have the
    format's syntax; no series twice; counters end in _total and never go negative;
    histogram buckets are cumulative, end with le="+Inf" equal to _count. Returns the
    family types and every sample's value."""
    assert text.endswith("\n"), "the text must end with a newline"
    types: dict[str, str] = {}
    helped: set[str] = set()
    series: Series = {}
    current: str | None = None
    for number, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {number}: {line!r}"
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert re.fullmatch(_NAME, name) and name not in helped, where
            helped.add(name)
            current = None
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name in helped and name not in types, where
            assert kind in _SUFFIXES, where
            if kind == "counter":
                assert name.endswith("_total"), where
            types[name] = kind
            current = name
            continue
        assert not line.startswith("#") and line, where
        match = _SAMPLE.match(line)
        assert match is not None, where
        name, value = match.group(1), match.group(match.lastindex or 0)
        assert _VALUE.match(value), where
        assert current is not None and any(
            name == current + suffix for suffix in _SUFFIXES[types[current]]
        ), f"{where} is not a sample of the family before it ({current})"
        labels = tuple(
            (key, val) for key, val in re.findall(_LABEL, line[len(name):line.rfind(" ")])
        )
        assert len({key for key, _ in labels}) == len(labels), where
        key = (name, labels)
        assert key not in series, f"{where}: this series appears twice"
        number_value = float(value.replace("Inf", "inf"))
        if types[current] == "counter":
            assert number_value >= 0, where
        series[key] = number_value
    for name, kind in types.items():
        if kind == "histogram":
            buckets = [(dict(labels)["le"], value) for (sample, labels), value in series.items()
                       if sample == name + "_bucket"]
            assert buckets and buckets[-1][0] == "+Inf", name
            bounds = [float(le.replace("Inf", "inf")) for le, _ in buckets]
            assert bounds == sorted(bounds), name
            counts = [value for _, value in buckets]
            assert counts == sorted(counts), f"{name}: buckets must be cumulative"
            assert counts[-1] == series[(name + "_count", ())], name
    return types, series


def value(series: Series, name: str, **labels: str) -> float:
    return series.get((name, tuple(labels.items())), 0.0)


async def http(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    assert int(headers["content-length"]) == len(body) or request.startswith(b"HEAD")
    return status, headers, body


async def scrape(port: int) -> Series:
    status, headers, body = await http(port, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert status == "HTTP/1.1 200 OK"
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse(body.decode())[1]


def test_the_parser_refuses_what_the_format_does_not_allow() -> None:
    good = "# HELP a_total x\n# TYPE a_total counter\na_total{op=\"x\"} 1\n"
    parse(good)
    for bad in (
        good.rstrip("\n"),  # no final newline
        good + 'a_total{op="x"} 2\n',  # a series twice
        "# TYPE a_total counter\na_total 1\n",  # TYPE without HELP
        "# HELP a x\n# TYPE a counter\na 1\n",  # a counter not ending in _total
        good + "b 1\n",  # a sample of no declared family
        '# HELP g x\n# TYPE g gauge\ng{op="x} 1\n',  # a broken label
        "# HELP g x\n# TYPE g gauge\ng one\n",  # not a number
        '# HELP h x\n# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\n'
        "h_sum 1\nh_count 1\n",  # buckets going down
    ):
        with pytest.raises(AssertionError):
            parse(bad)


async def test_the_endpoint_parses_and_its_counters_move_with_load(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds("metrics")
    address = await server.start("--metrics-listen", "127.0.0.1:0")
    port = server.metrics_port()  # the port it bound, not the 0 it was given
    assert port != 0 and f"metrics at http://127.0.0.1:{port}/metrics" in server.log()
    before = await scrape(port)
    assert value(before, "rsd_build_info", version="0.1.0") == 1
    assert value(before, "rsd_requests_total", op="CLAIM_ACQUIRE", result="ok") == 0

    async with AsyncRunstate(holder="load", address=address) as rs:
        await rs.mailboxes.ensure("jobs")
        run = await rs.scopes.create()
        lease = await run.claim("k").acquire()
        with pytest.raises(ConflictError):
            await run.claim("k").acquire()
        for n in range(3):
            await run.mailbox("jobs").submit({"n": n})
        delivery = await run.mailbox("jobs").receive(lease_seconds=30)
        assert delivery is not None
        await delivery.complete(result={"payload": "done"})
        await asyncio.sleep(0.6)  # the endpoint renders at most every 0.5 s
        after = await scrape(port)
        stats: dict[str, Any] = await rs.server_stats()
        await lease.release()

    assert value(after, "rsd_requests_total", op="CLAIM_ACQUIRE", result="ok") >= 1
    assert value(after, "rsd_requests_total", op="CLAIM_ACQUIRE", result="CLAIM_HELD") == 1
    assert value(after, "rsd_errors_total", code="CLAIM_HELD") == 1
    assert value(after, "rsd_requests_total", op="TASK_SUBMIT", result="ok") == 3
    assert value(after, "rsd_items", kind="task", state="SUCCEEDED") == 1
    assert value(after, "rsd_items", kind="task", state="PENDING") == 2
    assert value(after, "rsd_mailbox_ready", tenant="default", mailbox="jobs") == 2
    assert value(after, "rsd_mailbox_running", tenant="default", mailbox="jobs") == 0
    # three submits of {"n": n} (4 bytes each encoded) and one outcome "done" (5)
    assert value(after, "rsd_tenant_payload_bytes", tenant="default") == 3 * 4 + 5
    assert value(after, "rsd_tenant_payload_limit_bytes", tenant="default") == 1 << 30
    assert value(after, "rsd_connections") >= 1
    assert value(after, "rsd_leases") >= 1 and value(after, "rsd_claims") == 1
    assert value(after, "rsd_request_batch_seconds_count") > value(
        before, "rsd_request_batch_seconds_count")
    assert value(after, "rsd_fsync_seconds_count") > value(before, "rsd_fsync_seconds_count")
    assert value(after, "rsd_commit_wait_seconds_count") > 0
    assert value(after, "rsd_journal_bytes") > value(before, "rsd_journal_bytes") > 0
    assert value(after, "rsd_event_loop_lag_seconds_count") > 0

    # SERVER_STATS: the operator's fields, beside the older ones.
    assert stats["uptime_seconds"] > 0 and stats["ops_total"] >= 8
    assert stats["ops"]["CLAIM_ACQUIRE"]["errors"] == 1
    assert stats["errors"] == {"CLAIM_HELD": 1}
    assert stats["leases_held"] >= 1
    assert stats["tasks"]["SUCCEEDED"] == 1 and stats["tasks"]["PENDING"] == 2
    assert set(stats["messages"]) == set(stats["tasks"])
    assert stats["queue_depths"] == {
        "mailboxes": [{"tenant": "default", "mailbox": "jobs", "ready": 2, "running": 0}],
        "omitted": 0,
    }
    assert stats["journal_bytes"] > 0
    assert stats["last_snapshot_at"] is None and stats["last_snapshot_seconds"] is None
    fsync = stats["fsync_ms"]
    assert fsync["count"] > 0 and 0 <= fsync["p50"] <= fsync["p99"]
    assert fsync["last"] is not None
    assert "connections" in stats and "journal" in stats  # the older fields stay

    # Other paths and methods get plain HTTP errors; HEAD gets the head only.
    status, _, _ = await http(port, b"GET /other HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert status == "HTTP/1.1 404 Not Found"
    status, headers, _ = await http(port, b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert status == "HTTP/1.1 405 Method Not Allowed" and headers["allow"] == "GET, HEAD"
    status, headers, body = await http(port, b"HEAD /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
    assert status == "HTTP/1.1 200 OK" and body == b"" and int(headers["content-length"]) > 0
    status, _, _ = await http(port, b"garbage\r\n\r\n")
    assert status == "HTTP/1.1 400 Bad Request"
    assert await server.stop() == 0


async def test_a_snapshot_shows_in_the_metrics_stats_and_json_logs(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds("snap")
    address = await server.start("--metrics-listen", "127.0.0.1:0",
                                 "--snapshot-bytes", "4096", "--log-format", "json")
    port = server.metrics_port()
    async with AsyncRunstate(holder="load", address=address) as rs:
        run = await rs.scopes.create()
        for n in range(60):
            lease = await run.claim(f"key-{n}").acquire()
            await lease.release()

        async def snapshotted() -> dict[str, Any]:
            while (stats := await rs.server_stats())["last_snapshot_at"] is None:
                await asyncio.sleep(0.05)
            return stats

        stats = await asyncio.wait_for(snapshotted(), 10)
    assert stats["last_snapshot_seconds"] >= 0
    await asyncio.sleep(0.6)
    series = await scrape(port)
    assert value(series, "rsd_snapshot_seconds_count") >= 1
    assert value(series, "rsd_snapshot_last_time_seconds") == pytest.approx(
        stats["last_snapshot_at"], abs=60)
    assert await server.stop() == 0
    events = [json.loads(line) for line in server.log().splitlines()]  # one object a line
    by_message = {event["message"].split(" ")[0]: event for event in events}
    assert by_message["recovered"]["clean"] is True and "segments" in by_message["recovered"]
    written = [event for event in events if "written in" in event["message"]]
    assert written and written[0]["snapshot"].startswith("snapshot-")
    assert written[0]["covers"] >= 1 and written[0]["seconds"] >= 0
    started = [event for event in events if event["message"].startswith("snapshot of")]
    assert started and started[0]["writer_pid"] > 0


async def test_the_option_is_checked_and_a_busy_metrics_port_fails_the_start_cleanly(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds("checked")
    for bad in ("nonsense", "host:99999", "127.0.0.1:"):
        assert await server.refused("--metrics-listen", bad) == 2
        assert "--metrics-listen: must be HOST:PORT" in server.log()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy = squatter.getsockname()[1]
        assert await server.refused("--metrics-listen", f"127.0.0.1:{busy}") == 1
        assert "cannot serve HTTP on" in server.log()
    assert server.segments() == []  # nothing was written: the start failed before recovery
    await server.start()  # off by default: no endpoint, no log line about one
    assert "metrics at" not in server.log()
    assert await server.stop() == 0


def test_histogram_sums_are_finite() -> None:
    from rsd.metrics import LATENCY_BUCKETS, Histogram

    hist = Histogram(LATENCY_BUCKETS)
    for sample in (0.0, 0.00005, 0.3, 5.0):
        hist.observe(sample)
    assert hist.counts[0] == 2 and hist.counts[-1] == 1 and hist.count == 4
    assert math.isfinite(hist.sum)


async def test_label_sets_stay_bounded_and_hostile_scrapers_cannot_stall_rsd(
    rsds: Callable[..., Rsd],
) -> None:
    """Mailboxes past the first 100 get no series; op codes rsd does not know are one
    label; a deferred error counts by code; scrapers holding every place of the endpoint
    without finishing their requests do not slow the protocol port."""
    server = rsds("bounded")
    address = await server.start("--metrics-listen", "127.0.0.1:0")
    port = server.metrics_port()
    raw = await raw_connect(address)
    await raw.hello()
    run = (await raw.ok(Op.SCOPE_CREATE, {}))["scope"]
    for n in range(MAX_MAILBOX_SERIES + 5):
        await raw.ok(Op.MAILBOX_ENSURE, {"name": f"box-{n:03d}"})
    for op in range(1000, 1050):  # fifty op codes nobody defined
        code, _, _ = await raw.error(op, {})
        assert code == "UNKNOWN_OP"
    await raw.ok(Op.CLAIM_ACQUIRE, {"scope": run, "key": "k", "holder": "a"})
    code, _, _ = await raw.error(
        Op.CLAIM_ACQUIRE, {"scope": run, "key": "k", "wait": True, "timeout_ms": 50}
    )
    assert code == "WAIT_TIMEOUT"
    stats = await raw.ok(Op.SERVER_STATS, {})
    assert len(stats["queue_depths"]["mailboxes"]) == MAX_MAILBOX_SERIES
    assert stats["queue_depths"]["omitted"] == 5
    assert stats["ops"]["UNKNOWN"]["errors"] == 50

    await asyncio.sleep(0.6)
    series = await scrape(port)
    boxes = {dict(labels)["mailbox"] for (name, labels) in series if name == "rsd_mailbox_ready"}
    assert len(boxes) == MAX_MAILBOX_SERIES and "box-000" in boxes and "box-104" not in boxes
    assert value(series, "rsd_mailbox_series_omitted") == 5
    ops = {dict(labels)["op"] for (name, labels) in series if name == "rsd_requests_total"}
    assert "UNKNOWN" in ops and not any(op.isdigit() for op in ops)
    assert value(series, "rsd_requests_total", op="UNKNOWN", result="UNKNOWN_OP") == 50
    assert value(series, "rsd_requests_total", op="CLAIM_ACQUIRE", result="deferred") == 1
    assert value(series, "rsd_errors_total", code="WAIT_TIMEOUT") == 1

    # Every place of the endpoint held by a scraper that never finishes its request.
    held = []
    first = None
    for _ in range(MAX_CONNECTIONS):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metr")
        held.append(writer)
        first = first or reader
    await asyncio.sleep(0.1)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert first is not None
    with contextlib.suppress(ConnectionResetError):  # a reset is closed too
        # one more takes the place of the one that has waited longest for its request
        assert await asyncio.wait_for(first.read(), 2) == b""
    held.append(writer)
    loop = asyncio.get_running_loop()
    began = loop.time()
    for _ in range(20):
        await raw.ok(Op.PING, {})
    assert loop.time() - began < 1.0  # the protocol port answers as usual
    for writer in held:
        writer.close()
    raw.close()
    assert await server.stop() == 0
