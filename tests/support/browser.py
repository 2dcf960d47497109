"""The browser the dashboard's tests drive (Debian's Chromium, through Playwright), its
flags, and which of a page's messages are problems: one rule for every browser test.

A console error is a problem, but for a load Chromium aborted because a network interface
of the machine came or went: the partition tests make and remove veth pairs and bridges
(support/netns.py) while the browser tests run, and Chromium's network-change watch
aborts the loads then in flight (the page loads again at its next refresh). Seen in full
runs of the suite: such aborts and no other problem, on a page and on the shards' page.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHROMIUM", "FLAGS", "NETWORK_CHANGED", "keep_problems"]

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"  # a load aborted by an interface change


def keep_problems(page: Any, problems: list[str]) -> None:
    """Append each of ``page``'s console errors (but a load aborted by a network change)
    and page errors to ``problems`` as it comes."""

    def console(message: Any) -> None:
        if message.type == "error" and NETWORK_CHANGED not in message.text:
            problems.append(message.text)

    page.on("console", console)
    page.on("pageerror", lambda error: problems.append(str(error)))
