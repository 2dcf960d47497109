"""The codec alone: encode and decode cost per frame, no sockets, no server.

The end-to-end benches measure the codec together with the loop, the core and the
journal; this one isolates ``rsproto`` so a change to framing shows on its own. Frames:
a LEASE_RENEW of one lease (the hot path), a CLAIM_ACQUIRE, its reply, a task submit
with a 200-byte payload, and a renewal of 1000 leases. Decoding feeds one buffer of many
frames at once (64 KiB), as a read from a pipelined connection does.

Each frame is measured both ways the codec works: as a user's request (encoded by
msgpack-python, ``wire.encode``; decoded by it as a server reads a client,
``Decoder()``) and as what an rsd writes (encoded by msgspec, ``wire.pack_from_rsd``;
decoded by msgspec as a client reads its server, ``Decoder(from_rsd=True)``).

    .venv/bin/python -m bench.codec [--frames 200000]

Each figure is the best of REPEATS windows.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import rsproto as wire
from rsproto import Op


def _handle(lease_id: int) -> bytes:
    """A lease handle as rsd sends them: the id, then 8 random bytes."""
    return lease_id.to_bytes(8, "big") + b"\x8d\x1f\x3a\xc2\x07\x94\x5e\xb1"


SAMPLES: dict[str, list[Any]] = {
    "renew, 1 lease": [wire.REQUEST, 7, int(Op.LEASE_RENEW), {"leases": [_handle(123456)]}],
    "claim acquire": [
        wire.REQUEST, 8, int(Op.CLAIM_ACQUIRE),
        {"scope": "run-1a2b3c4d", "key": "company:acme", "lease_seconds": 30},
    ],
    "claim reply": [
        wire.REPLY, 8,
        {"acquired": True, "lease": _handle(123457), "generation": 3, "holder": "researcher-1",
         "lease_seconds": 30},
    ],
    "submit, 200 B": [
        wire.REQUEST, 9, int(Op.TASK_SUBMIT),
        {"scope": "run-1a2b3c4d", "mailbox": "research", "key": "research:acme",
         "data": {"company": "acme", "notes": "x" * 160}},
    ],
    "renew, 1000 leases": [
        wire.REQUEST, 10, int(Op.LEASE_RENEW),
        {"leases": [_handle(n) for n in range(100_000, 101_000)]},
    ],
}


REPEATS = 50  # each figure is the best of this many short windows (timeit's way: on a
# shared machine a slower window measured the other processes too, not the codec alone)


def _encode_us(encode: Callable[[list[Any]], bytes], message: list[Any], count: int) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(count // REPEATS):
            encode(message)
        best = min(best, (time.perf_counter() - start) / (count // REPEATS) * 1e6)
    return best


def _decode_us(frame: bytes, count: int, from_rsd: bool) -> float:
    batch = min(count, max(1, (64 << 10) // len(frame)))  # about 64 KiB per feed (a read)
    stream = frame * batch
    decoder = wire.Decoder(from_rsd=from_rsd)
    rounds = max(1, count // batch // REPEATS)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(rounds):
            decoder.feed(stream)
        best = min(best, (time.perf_counter() - start) / (rounds * batch) * 1e6)
    return best


def _rsd_frame(message: list[Any]) -> bytes:
    body = wire.pack_from_rsd(message)
    return wire.pack_header(len(body)) + body


def measure(message: list[Any], frames: int) -> tuple[float, float, float, float, int]:
    """(encode and decode µs/frame as a user's request, the same as what an rsd writes,
    frame bytes)."""
    frame = wire.encode(message)
    assert _rsd_frame(message) == frame, "both encoders must write the same bytes"
    count = max(REPEATS, frames if len(frame) < 1000 else frames // 100)
    return (_encode_us(wire.encode, message, count), _decode_us(frame, count, False),
            _encode_us(_rsd_frame, message, count), _decode_us(frame, count, True), len(frame))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=200_000)
    args = parser.parse_args()
    print(f"{'frame':<20} {'bytes':>7} {'encode µs':>10} {'decode µs':>10}"
          f" {'rsd encode µs':>14} {'from rsd decode µs':>19}")
    for name, message in SAMPLES.items():
        encode_us, decode_us, rsd_encode_us, rsd_decode_us, size = measure(message, args.frames)
        print(f"{name:<20} {size:>7} {encode_us:>10.2f} {decode_us:>10.2f}"
              f" {rsd_encode_us:>14.2f} {rsd_decode_us:>19.2f}")


if __name__ == "__main__":
    main()
