"""The Prefect UI, seen by a browser: ``askflow ui --worker`` serves it, ``askflow deploy``
schedules the retraining, the worker completes a run of the deployment, and headless
Chromium finds the deployment, its schedule and the completed run on the deployment's page.
The screenshot is left in reports/prefect_ui.png (git-ignored: rewritten on every run)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from stages.cli import main
from tests.conftest import REPO

pytest_plugins = ["tests.prefect_support"]
pytestmark = pytest.mark.slow

SCREENSHOT = REPO / "reports" / "prefect_ui.png"
SCHEDULE_TEXT = "At 03:00 AM, only on Monday"  # how the UI words the cron "0 3 * * 1"
# CI sets this (.ci/run): there a missing browser is a failure, not a skip.
REQUIRE_BROWSER = "ASKFLOW_REQUIRE_BROWSER"


def test_ui_shows_the_deployment_its_schedule_and_a_completed_run(prefect_ui, prefect_api_url, capsys, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.deployments import run_deployment

    browser = chromium()
    status = main(["deploy", "--root", str(prefect_ui.root)])  # the API from PREFECT_API_URL
    out, err = capsys.readouterr()
    assert (status, err) == (0, ""), err
    deployment_id = re.search(r"\(([0-9a-f-]{36})\)", out).group(1)

    run = run_deployment("retrain/askflow-retrain", timeout=0, as_subflow=False)  # the worker picks it up
    with get_client(sync_client=True) as client:
        run = wait_for(lambda: final(client.read_flow_run(run.id)), 120, f"flow run {run.id} to finish\n{prefect_ui.output()[-3000:]}")
        assert run.state.is_completed(), f"{run.state}\n{prefect_ui.output()[-3000:]}"
        upcoming = wait_for(
            lambda: [
                r for r in client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[run.deployment_id])))
                if r.state_name == "Scheduled" and r.auto_scheduled
            ],
            60, "the scheduler to create the deployment's next runs",
        )
    assert str(run.deployment_id) == deployment_id
    assert {(r.expected_start_time.weekday(), r.expected_start_time.hour, r.expected_start_time.minute) for r in upcoming} == {(0, 3, 0)}

    # The run executed in the project: its record names the run and the deployment.
    record = json.loads(next((prefect_ui.root / "reports" / "retrain").glob(f"*-{str(run.id)[:8]}.json")).read_text())
    assert record["run"]["deployment_id"] == deployment_id and record["stages"]["corpus"]["ran"] is True

    page = f"{prefect_ui.url}/deployments/deployment/{deployment_id}"
    SCREENSHOT.parent.mkdir(exist_ok=True)
    with Chromium(browser, tmp_path / "chromium") as chrome:
        text = chrome.open(page, until=lambda text: run.name in text and SCHEDULE_TEXT in text and "Next Run" in text)
        chrome.screenshot(SCREENSHOT)
    assert "askflow-retrain" in text and SCHEDULE_TEXT in text
    # The run's row: its name, then its state badge (the run-state filter also lists "Completed").
    row = text[text.index(run.name):][:200]
    assert "Completed" in row, row
    assert SCREENSHOT.stat().st_size > 10_000 and SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def final(run: Any) -> Any:
    return run if run.state is not None and run.state.is_final() else None


def wait_for(probe, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.5)
    return value


# --- Chromium ---------------------------------------------------------------------------------


def chromium() -> str:
    """The browser; installed with apt when missing and possible, else the test is skipped
    (failed where ASKFLOW_REQUIRE_BROWSER is set)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]):
            if subprocess.run(command, env=env, capture_output=True, timeout=600).returncode != 0:
                break
        found = shutil.which("chromium")
    if found is None:
        if os.environ.get(REQUIRE_BROWSER):
            pytest.fail(f"chromium is not installed and could not be installed ({REQUIRE_BROWSER} is set)")
        pytest.skip("chromium is not installed and could not be installed (apt-get install chromium)")
    return found


class Chromium:
    """Headless Chromium driven over the DevTools protocol: the UI is a single-page app, so
    its text is read when the app has rendered it, not when the HTML has loaded."""

    def __init__(self, executable: str, profile: Path):
        self.executable, self.profile = executable, profile
        self.ids = iter(range(1, 1_000_000))

    def __enter__(self) -> "Chromium":
        from websockets.sync.client import connect

        self.profile.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                self.executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--lang=en-US", "--window-size=1400,1000",
                f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "about:blank",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            port_file = self.profile / "DevToolsActivePort"
            wait_for(lambda: port_file.exists() and len(port_file.read_text().splitlines()) >= 2, 30, "Chromium's DevTools port")
            port = int(port_file.read_text().splitlines()[0])
            pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            target = next(p for p in pages if p["type"] == "page")
            self.socket = connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.socket.close()
        self._stop()

    def _stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        request_id = next(self.ids)
        self.socket.send(json.dumps({"id": request_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=30))
            if message.get("id") == request_id:  # anything else is an event
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message["result"]

    def text(self) -> str:
        result = self.call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''", returnByValue=True)
        return result["result"].get("value") or ""

    def open(self, url: str, until, timeout_s: float = 60) -> str:
        """Navigate to ``url`` and return the page's text once ``until(text)`` holds."""
        self.call("Page.navigate", url=url)

        def rendered() -> str | None:
            text = self.text()
            return text if until(text) else None

        try:
            return wait_for(rendered, timeout_s, f"{url} to render")
        except AssertionError as error:
            raise AssertionError(f"{error}; the page shows:\n{self.text()[:3000]}") from None

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
