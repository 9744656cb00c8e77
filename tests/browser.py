"""Headless Chromium for the explorer's browser tests (Debian's ``chromium`` and ``chromium-driver``).

Install: ``apt-get install -y chromium chromium-driver`` and ``pip install selenium``. Without them the
browser tests skip with this reason (and under CI=true a skip fails the run, tests/conftest.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1200,900",
]


def start_browser(user_data_dir: str):
    """A headless Chromium driven by selenium, logging the console and the network (CDP performance log)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed: pip install -r requirements-dev.txt")
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not Path(exe).is_file():
            pytest.skip(f"{exe} is missing: apt-get install -y chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={user_data_dir}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def requested_urls(driver) -> list[str]:
    """Every URL the page asked for since the last call (Network.requestWillBeSent in the performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


class Browser:
    """One Chromium for a test module (starting it costs ~1 s); a fresh profile directory, removed at the end."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="mha-explorer-chromium-")
        try:
            self.driver = start_browser(self.profile)
        except BaseException:
            shutil.rmtree(self.profile, ignore_errors=True)
            raise

    def open(self, path: Path):
        """Load a page from a file; the logs are emptied first, so they hold only this page's events."""
        d = self.driver
        d.get("about:blank")
        d.get_log("browser")
        d.get_log("performance")
        d.get(Path(path).resolve().as_uri())
        return d

    def close(self) -> None:
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)
