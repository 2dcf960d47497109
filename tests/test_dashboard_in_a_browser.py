"""The dashboard in a real browser (Debian's Chromium, driven by Playwright for Python):
every page renders the live state of a populated rsd; "Requeue all" puts the dead
letters back and "Cancel the run" ends the run (both checked through the SDK); a wrong
token is refused (the page asks for one); an empty rsd renders with no console error.
``make test`` installs Chromium when it is missing; without it these tests skip."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.process import Rsd

from rsclient import AsyncRunstate
from rsd.tokens import hash_token, new_token

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OPS = new_token()

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"no {CHROMIUM} (make test installs it)")
playwright = pytest.importorskip("playwright.async_api")
expect = playwright.expect


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Any]:
    """A fresh Chromium profile; its console errors and page errors in ``.problems``."""
    async with playwright.async_playwright() as driver:
        context = await driver.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=FLAGS, headless=True)
        context.problems = []  # type: ignore[attr-defined]
        yield context
        await context.close()


async def open_page(browser: Any, url: str) -> Any:
    page = await browser.new_page()
    page.on("console", lambda m: m.type == "error" and browser.problems.append(m.text))
    page.on("pageerror", lambda e: browser.problems.append(str(e)))
    page.on("dialog", lambda dialog: dialog.accept())
    await page.goto(url)
    return page


async def test_an_empty_rsd_renders_every_page_without_errors(
    rsds: Callable[..., Rsd], browser: Any,
) -> None:
    server = rsds()
    await server.start("--http-listen", "127.0.0.1:0")  # no tokens file: loopback
    base = f"http://127.0.0.1:{server.metrics_port()}/"
    page = await open_page(browser, base)
    await expect(page.locator("h1")).to_have_text("Overview")
    await expect(page.locator("#who")).to_contain_text("tenant default")
    for hash_, title in (("#/runs", "Runs"), ("#/pools", "Pools"), ("#/", "Overview")):
        await page.goto(base + hash_)
        await expect(page.locator("h1")).to_have_text(title)
    await page.wait_for_timeout(1500)  # a poll or two
    assert browser.problems == []
    assert await page.locator("#error").is_hidden()


async def test_every_page_shows_the_live_state_and_its_buttons_act(
    rsds: Callable[..., Rsd], browser: Any,
) -> None:
    server = rsds()
    tokens = server.write_tokens(f"{hash_token(OPS)} ops admin")
    await server.start("--tokens-file", str(tokens), "--http-listen", "127.0.0.1:0")
    base = f"http://127.0.0.1:{server.metrics_port()}/"
    async with AsyncRunstate("ops-1", server.address, token=OPS) as ops:
        run = await ops.scopes.create()
        await run.claim("a").try_acquire()
        await ops.mailboxes.ensure("jobs", mode="WORK", max_attempts=1)
        box = run.mailbox("jobs")
        for n in range(3):
            await box.submit({"n": n}, key=f"job-{n}")
        for _ in range(2):
            await (await box.receive()).reject("bad input")
        await ops.pools.ensure("gpu", size=2)
        await run.schedules.ensure("nightly", mailbox="jobs", cron="0 3 * * *")

        # A wrong token: refused, and the page asks for one.
        page = await open_page(browser, base + "#token=" + new_token())
        await expect(page.locator("#login")).to_be_visible()
        await expect(page.locator("#error")).to_contain_text("admin token")
        await page.close()
        browser.problems.clear()  # the 401s the browser logged

        page = await open_page(browser, base + "#token=" + OPS)
        await expect(page.locator("#who")).to_contain_text("tenant ops (admin)")
        await expect(page.locator("main")).to_contain_text("jobs")  # a queue depth
        await page.goto(base + "#/runs")
        await expect(page.locator("main")).to_contain_text(run.id)
        await page.goto(base + f"#/runs/{run.id}")
        await expect(page.locator("main")).to_contain_text("ops-1")  # the claim's holder
        await expect(page.locator("main")).to_contain_text("FAILED")
        await page.goto(base + "#/pools")
        await expect(page.locator("main")).to_contain_text("gpu")
        await page.goto(base + f"#/runs/{run.id}/schedules")
        await expect(page.locator("main")).to_contain_text("nightly")
        ticket = await box.submit({"n": 9}, key="job-9")
        await page.goto(base + f"#/runs/{run.id}/tasks/{ticket.id}")
        await expect(page.locator("main")).to_contain_text("PENDING")

        await page.goto(base + f"#/runs/{run.id}/mailboxes/jobs")
        await expect(page.locator("main")).to_contain_text("Dead letters (2)")
        await page.click("#requeue-all")
        await expect(page.locator("main")).to_contain_text("Dead letters (0)")
        assert (await box.inspect())["dead_letters"] == 0  # through the SDK

        await page.goto(base + f"#/runs/{run.id}")
        await page.click("#cancel")  # the confirm dialog is accepted
        await expect(page.locator("h1")).to_contain_text("(cancelled)")
        assert (await run.status())["state"] == "cancelled"
        assert browser.problems == []
