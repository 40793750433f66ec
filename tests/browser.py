"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol, for the
report's browser tests.

Why this and not Playwright or Selenium: Playwright downloads its own browser builds (no
internet here beyond PyPI and Debian); Selenium would need `chromium-driver` plus its
logging capability to see console messages. The DevTools protocol is what both use
underneath: Chromium started with ``--remote-debugging-port=0`` prints its WebSocket
address, and `websocket-client` (already installed: the `kubernetes` client depends on it)
speaks to it. Console errors are collected for real: ``Runtime.consoleAPICalled``,
``Runtime.exceptionThrown`` and ``Log.entryAdded`` (failed loads, CSP violations);
``Network.requestWillBeSent`` records every fetch the page makes.

`visit` opens a file once (the report); `session` keeps a page open for a live one (the
dashboard: evaluate, wait, screenshot again).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websocket

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MAX_SHOT_PX = 8000


@dataclass
class PageVisit:
    url: str
    console: list[dict[str, Any]] = field(default_factory=list)
    """Every console message, exception and log entry: {source, level, text}."""
    requests: list[str] = field(default_factory=list)
    """Every URL the page asked for (the page itself included)."""
    checks: dict[str, Any] = field(default_factory=dict)
    """What the in-page script returned (see `visit`)."""
    screenshot: bytes = b""

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [m for m in self.console if m["level"] in ("error", "exception")]


class DevTools:
    def __init__(self, ws_url: str) -> None:
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        my_id = self.next_id
        self.ws.settimeout(60)
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, method: str, timeout_s: float) -> dict[str, Any]:
        for e in self.events:
            if e["method"] == method:
                return e
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            msg = json.loads(self.ws.recv())
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == method:
                    return msg
        raise TimeoutError(f"no {method} within {timeout_s} s")

    def drain(self, quiet_s: float) -> None:
        """Collect events until none arrives for ``quiet_s`` seconds."""
        self.ws.settimeout(quiet_s)
        while True:
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                return
            if "method" in msg:
                self.events.append(msg)

    def close(self) -> None:
        self.ws.close()


IN_PAGE_CHECKS = """
(() => {
  const figs = [...document.querySelectorAll('figure[data-figure]')].map(f => {
    const img = f.querySelector('img');
    return {id: f.id, complete: !!img && img.complete, width: img ? img.naturalWidth : 0,
            height: img ? img.naturalHeight : 0,
            src: img ? img.getAttribute('src').slice(0, 22) : ''};
  });
  const tables = [...document.querySelectorAll('table[data-table]')].map(t => ({
    id: t.id, rows: t.tBodies[0] ? t.tBodies[0].rows.length : 0}));
  return JSON.stringify({title: document.title, figures: figs, tables: tables,
    scripts: document.scripts.length,
    height: document.documentElement.scrollHeight,
    text: document.body.innerText.slice(0, 4000)});
})()
"""


DASHBOARD_CHECKS = """
JSON.stringify({
  polls: Number(document.body.dataset.polls),
  sims: [...document.querySelectorAll('section.sim')].map(s => ({
    name: s.dataset.sim, namespace: s.dataset.namespace, phase: s.dataset.phase,
    points: Number(s.dataset.residualPoints), columns: Number(s.dataset.heatColumns),
    lines: s.querySelectorAll('polyline').length, cells: s.querySelectorAll('rect').length})),
  rows: [...document.querySelectorAll('#queue tbody tr')].map(r => r.cells[0].textContent),
  source: document.getElementById('source').textContent,
  status: document.getElementById('status').textContent,
  text: document.body.innerText})
"""
"""What `rankpack dashboard`'s page drew (its data- attributes and text): each Simulation's
residual points and heat-map columns, the queue's rows, the header and status lines."""


def _messages(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
            out.append({"source": "console", "level": p["type"], "text": text})
        elif m == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d.get("text", "")
            out.append({"source": "exception", "level": "exception", "text": text})
        elif m == "Log.entryAdded":
            entry = p["entry"]
            out.append({"source": entry["source"], "level": entry["level"],
                        "text": entry["text"]})  # fmt: skip
    return out


class Browser:
    """One headless Chromium page, driven step by step (`session`): open a URL, evaluate
    scripts, take screenshots; what the console said and what was fetched, so far."""

    def __init__(self, tools: DevTools, width: int, height: int) -> None:
        self.tools, self.width, self.height = tools, width, height
        self.url = ""

    def open(self, url: str, settle_s: float = 1.0) -> None:
        self.url = url
        self.tools.call("Page.navigate", url=url)
        self.tools.wait_event("Page.loadEventFired", timeout_s=60)
        self.tools.drain(settle_s)

    def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (JSON-able)."""
        found = self.tools.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in found:
            raise RuntimeError(f"{expression[:80]}: {found['exceptionDetails']}")
        return found["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float) -> Any:
        """Evaluate ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            self.tools.drain(0.2)

    def screenshot(self, height: int | None = None) -> bytes:
        """A PNG of the page from its top, ``height`` px (default: all of it up to
        `MAX_SHOT_PX`), halved."""
        full = int(self.evaluate("document.documentElement.scrollHeight"))
        shot_h = min(height or full, full, MAX_SHOT_PX)
        shot = self.tools.call(
            "Page.captureScreenshot", format="png", captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": self.width, "height": shot_h, "scale": 0.5},
        )  # fmt: skip
        return base64.b64decode(shot["data"])

    @property
    def console(self) -> list[dict[str, Any]]:
        self.tools.drain(0.05)
        return _messages(self.tools.events)

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [m for m in self.console if m["level"] in ("error", "exception")]

    @property
    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"][:200] for e in self.tools.events
                if e["method"] == "Network.requestWillBeSent"]  # fmt: skip


@contextmanager
def session(*, width: int = 1280, height: int = 900) -> Iterator[Browser]:
    """Headless Chromium with one page (`Browser`), stopped afterwards."""
    assert CHROMIUM, "chromium is not installed (apt-get install chromium)"
    profile = tempfile.mkdtemp(prefix="rankpack-chromium-")
    argv = [
        CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--mute-audio",
        f"--user-data-dir={profile}", "--remote-debugging-port=0",
        "--remote-allow-origins=*", f"--window-size={width},{height}", "about:blank",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    tools: DevTools | None = None
    try:
        port = _devtools_port(proc, profile, timeout_s=60)
        tools = DevTools(_page_ws(port))
        for domain in ("Page", "Runtime", "Log", "Network"):
            tools.call(f"{domain}.enable")
        yield Browser(tools, width, height)
    finally:
        if tools is not None:
            tools.close()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)


def visit(page: Path, *, width: int = 1280, height: int = 900, settle_s: float = 1.0) -> PageVisit:
    """Open ``page`` in headless Chromium; collect console messages, requests, the in-page
    checks and a full-page PNG screenshot."""
    with session(width=width, height=height) as b:
        url = page.absolute().as_uri()
        b.open(url, settle_s)
        checks = json.loads(b.evaluate(IN_PAGE_CHECKS))
        shot = b.screenshot()
        b.tools.drain(0.3)
        return PageVisit(url=url, console=b.console, requests=b.requests, checks=checks,
                         screenshot=shot)  # fmt: skip


def _devtools_port(proc: subprocess.Popen[str], profile: str, timeout_s: float) -> int:
    """Chromium writes its port to <profile>/DevToolsActivePort once it listens."""
    marker = Path(profile) / "DevToolsActivePort"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"chromium exited with {proc.returncode}: {err[-2000:]}")
        if marker.is_file():
            first = marker.read_text().splitlines()[:1]
            if first and re.fullmatch(r"\d+", first[0]):
                return int(first[0])
        time.sleep(0.1)
    raise TimeoutError("chromium did not open its DevTools port")


def _page_ws(port: int) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = json.loads(r.read())
        pages = [t for t in targets if t.get("type") == "page"]
        if pages:
            url: str = pages[0]["webSocketDebuggerUrl"]
            return url
        time.sleep(0.1)
    raise TimeoutError("chromium has no page target")


def blank_fraction(png: bytes) -> tuple[float, int]:
    """(fraction of pixels equal to the most common colour, number of distinct colours) of a
    PNG: a blank page is ~1.0 and has a handful of colours."""
    import io

    import numpy as np
    from matplotlib import image

    pixels = image.imread(io.BytesIO(png), format="png")
    flat = (pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    colours, counts = np.unique(flat, axis=0, return_counts=True)
    return float(counts.max() / counts.sum()), len(colours)
