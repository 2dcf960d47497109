"""The browser tests' ``load_page`` (tests/support/browser.py) loads a dashboard page again
when a network change aborted one of the page's own files (its document, script or style
sheet: without app.js a page stays at "Loading…"), and only then; an aborted call to
rsd's API is left to the page's own next refresh. Shown on a stand-in for Playwright's
page that reports the failed requests a real one reported (the partition tests' veth
pairs and bridges abort Chromium's loads in flight: ERR_NETWORK_CHANGED, which no route
of Playwright's can make).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from support.browser import LOADS, NETWORK_CHANGED, load_page

playwright = pytest.importorskip("playwright.async_api")
PlaywrightError = playwright.Error

URL = "http://127.0.0.1:1/#token=t"


@dataclass
class Request:
    url: str
    resource_type: str
    failure: str | None


class Page:
    """Each load reports the failed requests ``failures`` gives for that load."""

    def __init__(self, failures: list[list[Request]], goto_fails: int = 0) -> None:
        self.failures = failures
        self.goto_fails = goto_fails  # the first loads by goto whose document is aborted
        self.loads: list[str] = []
        self.listeners: list[Callable[[Any], None]] = []

    def on(self, event: str, listener: Callable[[Any], None]) -> None:
        assert event == "requestfailed"
        self.listeners.append(listener)

    def remove_listener(self, event: str, listener: Callable[[Any], None]) -> None:
        self.listeners.remove(listener)

    async def _load(self, how: str) -> None:
        failed = self.failures[len(self.loads)] if len(self.loads) < len(self.failures) else []
        self.loads.append(how)
        for request in failed:
            for listener in list(self.listeners):
                listener(request)

    async def goto(self, url: str) -> None:
        await self._load(f"goto {url}")
        if self.goto_fails:
            self.goto_fails -= 1
            raise PlaywrightError(f"Page.goto: {NETWORK_CHANGED} at {url}")

    async def reload(self) -> None:
        await self._load("reload")


def aborted(resource_type: str, path: str = "/static/app.js") -> Request:
    return Request("http://127.0.0.1:1" + path, resource_type, NETWORK_CHANGED)


async def test_a_page_whose_script_a_network_change_aborted_is_reloaded() -> None:
    page = Page([[aborted("script")], []])
    await load_page(page, URL)
    assert page.loads == [f"goto {URL}", "reload"]
    assert page.listeners == []


async def test_an_aborted_style_sheet_reloads_too_but_an_aborted_api_call_does_not() -> None:
    page = Page([[aborted("stylesheet", "/static/app.css")], [aborted("fetch", "/api/runs")]])
    await load_page(page, URL)
    assert page.loads == [f"goto {URL}", "reload"]


async def test_a_document_aborted_itself_is_fetched_again_not_reloaded() -> None:
    page = Page([], goto_fails=1)
    await load_page(page, URL)
    assert page.loads == [f"goto {URL}", f"goto {URL}"]


async def test_a_file_that_failed_for_another_reason_is_not_loaded_again() -> None:
    page = Page([[Request("http://127.0.0.1:1/static/app.js", "script", "net::ERR_FAILED")]])
    await load_page(page, URL)
    assert page.loads == [f"goto {URL}"]


async def test_a_page_aborted_at_every_load_fails_naming_what_was_aborted() -> None:
    page = Page([[aborted("script")]] * LOADS)
    with pytest.raises(AssertionError, match=r"app\.js"):
        await load_page(page, URL)
    assert len(page.loads) == LOADS
    assert page.listeners == []
