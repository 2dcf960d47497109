"""A stranger floods one /24 with wrong tokens: is a valid client from it still served?

Starts rsd with a tokens file, then for ``--seconds`` runs an attacker of
``--connections`` concurrent connections spread over ``--sources`` source addresses of
127.0.0.0/24 (127.0.0.1 first: the valid client's own address), each one HELLO with a
wrong token after another, each read to the end. Beside it, from 127.0.0.1, a valid
client opens a connection and says HELLO with a valid token every 0.2 s; each time to
be served is recorded (a refusal counts as not served).

Prints one JSON line: the valid client's HELLOs served / tried and their time to be
served (p50, max, ms); the attacker's HELLOs answered per second, split into
"checked and wrong" (UNAUTHENTICATED "the token is not valid": a guess tested),
"refused unchecked" (UNAUTHENTICATED for too many failures: nothing tested) and "slowed
down" (UNAVAILABLE with retry_after_ms). Note that with a valid token always served at
once, any answer that is not a success tells an attacker its guess was wrong: the
guesses tested per second are the checked ones plus the slowed-down ones.

    .venv/bin/python -m bench.lockout [--seconds 10] [--connections 64] [--sources 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import start_rsd, stop_rsd
from rsd.security.tokens import hash_token, new_token
from rsproto import ERROR, MAX_FRAME_BYTES, PROTOCOL_VERSION, REPLY, REQUEST, Decoder, Op, encode


async def hello(port: int, source: str, token: str, timeout: float = 30.0) -> list[Any]:
    """One connection from ``source``, one HELLO; the messages until rsd closes (or, if
    served, the reply)."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), timeout
    )
    decoder = Decoder(MAX_FRAME_BYTES)
    args = {"version": PROTOCOL_VERSION, "holder": "lockout", "token": token}
    writer.write(encode([REQUEST, 1, Op.HELLO, args]))
    messages: list[Any] = []
    try:
        while True:
            data = await asyncio.wait_for(reader.read(1 << 16), timeout)
            if not data:
                return messages
            messages.extend(decoder.feed(data))
            if messages and messages[0][0] == REPLY:
                return messages
    except (ConnectionResetError, TimeoutError):
        return messages
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def kind_of(messages: list[Any]) -> str:
    if not messages:
        return "closed"
    first = messages[0]
    if first[0] == REPLY:
        return "served"
    if first[0] == ERROR and first[2] == "UNAVAILABLE":
        return "slowed_down"
    if first[0] == ERROR and "not valid" in first[3]:
        return "checked_wrong"
    if first[0] == ERROR and "too many failed" in first[3]:
        return "refused_unchecked"
    return f"other:{first[2]}"


async def attacker(port: int, source: str, until: float, tally: dict[str, int]) -> None:
    n = 0
    while time.monotonic() < until:
        n += 1
        try:
            kind = kind_of(await hello(port, source, f"rsd_guess_{source}_{n}"))
        except OSError:
            kind = "connect_failed"
            await asyncio.sleep(0.01)
        tally[kind] = tally.get(kind, 0) + 1


async def valid_client(port: int, token: str, until: float, times: list[float | None]) -> None:
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            served = kind_of(await hello(port, "127.0.0.1", token, timeout=10)) == "served"
        except OSError:
            served = False
        times.append(time.monotonic() - started if served else None)
        await asyncio.sleep(0.2)


def ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lockout")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--sources", type=int, default=16)
    args = parser.parse_args()
    token = new_token()
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp) / "tokens"
        tokens.write_text(f"{hash_token(token)} ops admin\n")
        server = await start_rsd(Path(tmp) / "data", "--tokens-file", str(tokens))
        port = int(server.address.rpartition(":")[2])
        try:
            until = time.monotonic() + args.seconds
            tally: dict[str, int] = {}
            times: list[float | None] = []
            sources = [f"127.0.0.{1 + i % args.sources}" for i in range(args.connections)]
            await asyncio.gather(
                *(attacker(port, source, until, tally) for source in sources),
                valid_client(port, token, until, times),
            )
        finally:
            await stop_rsd(server.proc)
    served = [t for t in times if t is not None]
    per_second = {kind: round(count / args.seconds, 1) for kind, count in sorted(tally.items())}
    print(json.dumps({
        "seconds": args.seconds, "connections": args.connections, "sources": args.sources,
        "valid_served": f"{len(served)}/{len(times)}",
        "valid_ms_p50": ms(served, 0.5), "valid_ms_max": ms(served, 1.0),
        "attacker_per_second": per_second,
    }))


if __name__ == "__main__":
    asyncio.run(main())
