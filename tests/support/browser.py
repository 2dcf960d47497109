"""The browser the dashboard's tests drive (Debian's Chromium headless shell, through
Playwright), its flags, and which of a page's messages are problems: one rule for every
browser test.

A console error is a problem, but for a load Chromium aborted because a network interface
of the machine came or went: the partition tests make and remove veth pairs and bridges
(support/netns.py) while the browser tests run, and Chromium's network-change watch
aborts the loads then in flight. Seen in full runs of the suite: such aborts and no other
problem, on a page and on the shards' page.

An aborted call of the page to rsd's API is made again at the page's next refresh, a
second later. An aborted file of the page itself (its document, script or style sheet) is
not: without app.js the page stays at "Loading…" whatever the test waits for (seen once:
a task page, 15 s at "Loading…", no refresh stamped, no error shown). ``load_page``
loads such a page again; a test opens every page through it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHROMIUM", "FLAGS", "LOADS", "NETWORK_CHANGED", "keep_problems", "load_page"]

# Debian's chromium-headless-shell: Chromium's engine (Blink and V8 of the same release as
# Debian's chromium) without the browser around it, the build Playwright itself drives
# for a headless page. The whole browser in its headless mode cost 3.4 times the CPU for
# the same 19 dashboard tests (35 s against 10.4 s, its renderers 18.9 s against 5.2 s,
# measured per process on the 2-core machine) and 9 s more of the file's time.
CHROMIUM = "/usr/bin/chromium-headless-shell"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"  # a load aborted by an interface change
OWN_FILES = {"document", "script", "stylesheet"}  # a page's resource types it cannot do without
LOADS = 3  # loads of a page whose own files a network change aborted, at most


def keep_problems(page: Any, problems: list[str]) -> None:
    """Append each of ``page``'s console errors (but a load aborted by a network change)
    and page errors to ``problems`` as it comes."""

    def console(message: Any) -> None:
        if message.type == "error" and NETWORK_CHANGED not in message.text:
            problems.append(message.text)

    page.on("console", console)
    page.on("pageerror", lambda error: problems.append(str(error)))


async def load_page(page: Any, url: str) -> None:
    """Load ``url`` in ``page`` as a new document, and load it again while a network
    change aborted one of its own files, ``LOADS`` loads at most: ``page.reload`` when the
    document came (the same URL by ``goto`` would only change its fragment), ``goto``
    again when the document itself was aborted."""
    from playwright.async_api import Error  # (as the tests do: only where it is installed)

    aborted: list[str] = []

    def failed(request: Any) -> None:
        if NETWORK_CHANGED in (request.failure or "") and request.resource_type in OWN_FILES:
            aborted.append(request.url)

    page.on("requestfailed", failed)
    try:
        document = False  # whether a load brought the document itself
        for _ in range(LOADS):
            aborted.clear()
            try:
                await (page.reload() if document else page.goto(url))
                document = True
            except Error as exc:  # the document itself aborted
                if NETWORK_CHANGED not in str(exc):
                    raise
                document = False
                aborted.append(url)
            if not aborted:
                return
    finally:
        page.remove_listener("requestfailed", failed)
    raise AssertionError(f"{url}: a network change aborted {aborted} at each of {LOADS} loads")
