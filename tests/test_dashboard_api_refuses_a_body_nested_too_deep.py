"""An action's JSON body that nests arrays and objects deeper than a payload may
(``Limits.MAX_PAYLOAD_DEPTH``, 100) is refused with 400 INVALID_ARGUMENT, as the API's
other bad bodies are, before the JSON parser recurses into it. Before: a body of 5,000
``[`` answered 500 and logged a RecursionError traceback. Brackets inside strings do not
count. In-process (support/site.py): the body is refused before any core call.
"""

from __future__ import annotations

import json
import logging

import pytest
from support.site import Site, exchange

from rsproto import Limits


def action(body: bytes) -> bytes:
    return (b"POST /api/runs/r/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


@pytest.mark.parametrize("depth", [Limits.MAX_PAYLOAD_DEPTH + 1, 5000])
async def test_a_body_nested_too_deep_is_refused_with_400(
    depth: int, caplog: pytest.LogCaptureFixture,
) -> None:
    site = await Site.start()
    try:
        with caplog.at_level(logging.ERROR, logger="rsd"):
            status, body = await exchange(site.port, action(b"[" * depth + b"]" * depth))
        assert status == 400
        refused = json.loads(body)
        assert refused["error"] == "INVALID_ARGUMENT"
        assert f"more than {Limits.MAX_PAYLOAD_DEPTH} levels deep" in refused["message"]
        assert not caplog.records  # no traceback
    finally:
        site.close()


async def test_brackets_in_strings_and_the_limit_itself_pass_the_depth_check() -> None:
    site = await Site.start()
    try:
        deep = Limits.MAX_PAYLOAD_DEPTH - 1
        within = {"reason": "[{" * 3000, "x": json.loads("[" * deep + "]" * deep)}
        status, body = await exchange(site.port, action(json.dumps(within).encode()))
        assert status == 503  # past every check of the body, to the core: none here
        assert json.loads(body)["error"] == "NOT_PRIMARY"
    finally:
        site.close()
