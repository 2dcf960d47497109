"""The container image (Containerfile, `make image`) runs rsd as the deploy files expect:
from its own root file system, as UID 10001, on its data volume /var/lib/rsd, its
compiled core, its health probe wired; a client's task runs through it.

These machines can start no container (no cgroups for a runtime), so the test does by
hand what a runtime would: the image becomes a container's root file system (``buildah
from`` and ``mount``: its layers under a writable one), and rsd starts in it under
``chroot`` as the image's user, with the image's environment and entry point, its data
in the image's /var/lib/rsd. rsclient from this checkout then runs a task through it, the
probes answer, and the image's own HEALTHCHECK command passes against it (and fails
where nothing listens).

The image is built by `make test` in the background, at the lowest priority, from the
start (`make test-image`: the Containerfile with the wheel of this checkout's own install,
on a base made from the host's own Debian packages): given RSD_TEST_IMAGE_STATUS, the test
waits for the file where that build writes its exit code. Run alone (`make
test-image-check`), the test builds the image itself. It removes what it
made: the container (its mount and writable layer) and the image.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import build
from support.http import http
from support.process import REPO, STOP_TIMEOUT, refusing_address

from rsclient import AsyncRunstate

IMAGE = "localhost/rsd:test"  # the Makefile's TEST_IMAGE
USER = 10001  # the deploy files' runAsUser
DATA = "/var/lib/rsd"  # the image's volume
BUILD_WAIT = 900.0  # seconds: a bound on waiting for `make test`'s build, never a timing
READY_WAIT = 60.0  # seconds for rsd in the image to print its listening line
STATUS = os.environ.get("RSD_TEST_IMAGE_STATUS")  # set by `make test`: its build's exit code
EXPECTED = os.environ.get("RSD_EXPECT_COMPILED")

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(os.geteuid() != 0, reason="buildah builds and mounts the image as root"),
]


def buildah(*args: str) -> str:
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def wait_for_the_build() -> None:
    """The image `make test` builds in the background (its exit code in STATUS), or, run
    alone, the same build here."""
    if STATUS is None:
        done = subprocess.run(["make", "--no-print-directory", "test-image"], cwd=REPO,
                              capture_output=True, text=True, timeout=BUILD_WAIT)
        assert done.returncode == 0, f"make test-image:\n{done.stdout}{done.stderr}"
        return
    status = Path(STATUS)
    deadline = time.monotonic() + BUILD_WAIT
    while not status.exists():
        assert time.monotonic() < deadline, f"no {status} after {BUILD_WAIT:.0f} s"
        time.sleep(1)
    code = status.read_text().strip()
    log = status.with_suffix(".log").read_text(errors="replace")
    assert code == "0", f"make test-image exited {code}:\n{log[-5000:]}"


@pytest.fixture
def image() -> Iterator[dict[str, Any]]:
    """The image's configuration (Docker's format: the one with a HEALTHCHECK); the image
    is removed afterwards."""
    wait_for_the_build()
    try:
        yield json.loads(buildah("inspect", "--type", "image", IMAGE))["Docker"]["config"]
    finally:
        buildah("rmi", IMAGE)


@pytest.fixture
def root(image: dict[str, Any]) -> Iterator[Path]:
    """The image as a container's root file system, writable; gone afterwards."""
    container = buildah("from", "--pull-never", IMAGE)
    try:
        yield Path(buildah("mount", container))
    finally:
        buildah("umount", container)
        buildah("rm", container)


def environment(image: dict[str, Any], **extra: str) -> dict[str, str]:
    """The environment the image gives its processes (and nothing of the test's)."""
    env = dict(line.split("=", 1) for line in image["Env"])
    env.update(extra)
    return env


def as_its_user(root: Path, *command: str) -> list[str]:
    return ["chroot", f"--userspec={USER}:{USER}", str(root), *command]


def started(proc: subprocess.Popen[bytes], log: Path) -> str:
    """rsd's listening address, once it prints it."""
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_WAIT
    line = b""
    while not line.endswith(b"\n") and (left := deadline - time.monotonic()) > 0:
        if select.select([proc.stdout], [], [], left)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
    text = line.decode(errors="replace").strip()
    assert text.startswith("rsd listening on "), (
        f"rsd in the image did not start (said {text!r}, exit {proc.poll()}):\n"
        f"{log.read_text(errors='replace')}")
    return text.removeprefix("rsd listening on ")


def http_port(log: Path) -> int:
    """The HTTP listener's port, as rsd logs it before its listening line."""
    for line in log.read_text(errors="replace").splitlines():
        if "metrics at http://127.0.0.1:" in line:
            return int(line.split("metrics at http://127.0.0.1:")[1].split("/")[0])
    raise AssertionError(f"no HTTP listener in the log:\n{log.read_text(errors='replace')}")


async def a_task_runs(address: str) -> Any:
    """A worker and a planner through rsd in the image: the task's outcome."""
    async with AsyncRunstate(holder="image-test", address=address) as rs:
        await rs.mailboxes.ensure("jobs", mode="WORK")
        run = await rs.scopes.create()

        async def handle(data: Any, delivery: Any) -> None:
            await delivery.complete(result={"payload": {"doubled": data["n"] * 2}})

        stop = asyncio.Event()
        worker = asyncio.create_task(run.mailbox("jobs").consume(handle, stop_event=stop))
        ticket = await run.mailbox("jobs").submit({"n": 21}, key="n:21")
        outcome = await ticket.result(timeout_ms=60_000)
        stop.set()
        await worker
        return outcome


async def test_rsd_serves_a_task_from_the_images_root_as_its_user(
    image: dict[str, Any], root: Path, tmp_path: Path
) -> None:
    with open(REPO / "pyproject.toml", "rb") as file:
        version = tomllib.load(file)["project"]["version"]
    assert image["Labels"]["org.opencontainers.image.version"] == version
    assert image["User"] == f"{USER}:{USER}"
    assert DATA in image["Volumes"]
    assert image["Entrypoint"] == ["rsd"]
    assert image["Healthcheck"]["Test"][0] == "CMD"
    data = root / DATA.lstrip("/")
    assert (data.stat().st_uid, data.stat().st_gid) == (USER, USER)
    assert not list(data.iterdir())

    log = tmp_path / "rsd.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            as_its_user(root, *image["Entrypoint"], "--listen", "127.0.0.1:0",
                        "--http-listen", "127.0.0.1:0", "--data-dir", DATA),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file,
            env=environment(image),
        )
    try:
        address = started(proc, log)
        port = http_port(log)
        outcome = await a_task_runs(address)
        assert outcome["state"] == "SUCCEEDED", outcome
        assert outcome["outcome"] == {"doubled": 42}, outcome

        assert await http(port, "GET", "/healthz") == (200, {"ok": True})
        assert await http(port, "GET", "/readyz") == (200, {"ready": True})
        # The image's own HEALTHCHECK, run as a runtime would, pointed at this listener;
        # where nothing listens it fails.
        check = image["Healthcheck"]["Test"][1:]
        probe = environment(image, RSD_PROBE_URL=f"http://127.0.0.1:{port}/healthz")
        assert subprocess.run(as_its_user(root, *check), env=probe, timeout=30).returncode == 0
        with refusing_address() as nowhere:
            refused = environment(image, RSD_PROBE_URL=f"http://{nowhere}/healthz")
            assert subprocess.run(as_its_user(root, *check), env=refused,
                                  capture_output=True, timeout=30).returncode != 0

        # The image's rsd runs the build the suite runs (make test: the compiled core).
        modules = [build.module_name(source) for source in build.compiled_sources()]
        which = ("import importlib, json; print(json.dumps(sorted(m for m in "
                 f"{modules!r} if not importlib.import_module(m).__file__.endswith('.py'))))")
        compiled = subprocess.run(as_its_user(root, "python3", "-c", which), env=environment(image),
                                  capture_output=True, text=True, timeout=60, check=True)
        if EXPECTED is not None:
            assert json.loads(compiled.stdout) == (sorted(modules) if EXPECTED == "1" else [])

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT) == 0, log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()

    written = list(data.rglob("*"))
    assert written, f"nothing in {DATA}"
    assert {(path.stat().st_uid, path.stat().st_gid) for path in written} == {(USER, USER)}
