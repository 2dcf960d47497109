"""The dashboard's screenshots in docs/ (shown in the manual's page on the dashboard, docs/http.md).

Starts an rsd of its own (a temporary data directory, free ports, ``--http-listen``),
fills it as the browser tests do (tests/support/dashboard.py), keeps a little work
flowing for ``--seconds`` so the overview's chart has something to draw, then drives
Debian's Chromium through Playwright for Python to each page and writes
``docs/dashboard-<page>.png``. Nothing is downloaded: the page loads only what rsd
serves.

    make screenshots        # or: .venv/bin/python docs/screenshots.py [--seconds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # bench's harness, the suite's populate

from playwright.async_api import async_playwright  # noqa: E402
from support.browser import CHROMIUM, FLAGS  # noqa: E402
from support.dashboard import populate  # noqa: E402

from bench.harness import start_rsd, stop_rsd  # noqa: E402
from rsclient import AsyncRunstate  # noqa: E402

VIEWPORT = {"width": 1360, "height": 900}


async def keep_busy(run: Any, seconds: float | None) -> None:
    """Sends and takes messages in waves (the rate and the depth rise and fall), for
    ``seconds`` or until cancelled."""
    rng = random.Random(7)
    box = run.mailbox("emails")
    loop = asyncio.get_running_loop()
    ends = None if seconds is None else loop.time() + seconds
    while ends is None or loop.time() < ends:
        wave = 1 + int(20 * abs(((loop.time() % 20) - 10) / 10))
        for _ in range(wave):
            await box.send({"to": f"user-{rng.randrange(1000)}@example.com"})
        for _ in range(max(0, wave + rng.randrange(-3, 4))):
            got = await box.receive()
            if got is None:
                break
            await got.complete()
        await asyncio.sleep(0.1)


async def shoot(out: Path, seconds: float) -> list[Path]:
    port = _free_port()
    written = []
    with tempfile.TemporaryDirectory(prefix="rsd-shots-") as data:
        server = await start_rsd(Path(data), "--http-listen", f"127.0.0.1:{port}")
        try:
            async with AsyncRunstate("ops-1", server.address) as rs:
                made = await populate(rs)
                run = made.run
                traffic = rs.scope(made.others[0])  # beside it: the busy run's page stays short
                await keep_busy(traffic, seconds)  # the chart's minutes
                busy = asyncio.create_task(keep_busy(traffic, None))  # and on while it shoots
                base = f"http://127.0.0.1:{port}/#"
                pages = [
                    ("overview", "/"), ("runs", "/runs"), ("run", f"/runs/{run.id}"),
                    ("mailbox", f"/runs/{run.id}/mailboxes/jobs"),
                    ("task", f"/runs/{run.id}/tasks/{made.succeeded}"),
                    ("schedules", f"/runs/{run.id}/schedules"),
                    ("pools", "/pools"), ("pool", "/pools/gpu"), ("mailboxes", "/mailboxes"),
                ]
                async with async_playwright() as driver:
                    browser = await driver.chromium.launch(
                        executable_path=CHROMIUM, args=FLAGS, headless=True)
                    page = await browser.new_page(viewport=VIEWPORT)
                    for name, hash_ in pages:
                        await page.goto(base + hash_)
                        await page.wait_for_selector("#stamp:not(:empty)")
                        await page.wait_for_timeout(1200)  # a poll: the chart's newest row
                        path = out / f"dashboard-{name}.png"
                        await page.screenshot(path=str(path), full_page=True)
                        written.append(path)
                        await page.goto("about:blank")
                    await browser.close()
                busy.cancel()
        finally:
            await stop_rsd(server.proc)
    return written


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0,
                        help="how long work flows before the first screenshot")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    for path in asyncio.run(shoot(args.out, args.seconds)):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


if __name__ == "__main__":
    main()
