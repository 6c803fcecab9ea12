"""What the browser tests share: a uvicorn server for an app in a background thread, and a
headless Debian Chromium driven by playwright (it never downloads a browser of its own)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(app: Any, name: str) -> Iterator[str]:
    """``app`` served by uvicorn on a free loopback port; yields its base URL once /healthz
    answers, and stops it on exit."""
    port = free_port()
    srv = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=srv.run, name=f"uvicorn-{name}", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2):
                break
        except OSError:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"uvicorn did not come up on {base}") from None
            time.sleep(0.05)
    try:
        yield base
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


@contextmanager
def chromium(purpose: str, width: int = 1280) -> Iterator[Any]:
    """A persistent headless Chromium context on a fresh profile (fails plainly when Chromium or
    playwright is missing: the test is required, never skipped)."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(
            f"chromium is required for the {purpose} browser test and was not found at "
            f"{CHROMIUM} (Debian: apt-get install chromium)",
            pytrace=False,
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # pragma: no cover - the environment's fault, said plainly
        pytest.fail(
            f"the Python 'playwright' package is required for the {purpose} browser test: {exc}",
            pytrace=False,
        )
    profile = tempfile.mkdtemp(prefix="harvest-chromium-")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": width, "height": 900},
            device_scale_factor=1,
        )
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)
