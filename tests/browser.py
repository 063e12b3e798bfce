"""A real headless browser for the tests that look at a page as a person would: Debian's ``chromium`` driven by its
``chromium-driver`` through Selenium.

`ensure_chromium` is the CI setup step: on a fresh Debian machine run as root (CI) it installs both packages with
apt-get (``apt-get update && apt-get install -y chromium chromium-driver``), once; elsewhere it fails naming that
command. Never a skip: a browser test that quietly does not run tests nothing. ``make browser`` and ``.ci/run`` do
the same install before the tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

PACKAGES = ("chromium", "chromium-driver")
INSTALL = "apt-get update && apt-get install -y chromium chromium-driver"


def _found() -> tuple[str, str] | None:
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def ensure_chromium() -> tuple[str, str]:
    """(chromium, chromedriver) paths, installing Debian's packages first when they are missing and this process
    is root on a machine with apt-get; otherwise an error naming the command to run."""
    got = _found()
    if got:
        return got
    if not shutil.which("apt-get") or os.geteuid() != 0:
        raise RuntimeError(f"the browser tests need Debian's chromium and chromium-driver: run `{INSTALL}` as root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], check=True, env=env)
    got = _found()
    if not got:
        raise RuntimeError(f"apt-get installed {PACKAGES} but chromium or chromedriver is still not on PATH")
    return got


def headless_chromium(downloads: Path):  # noqa: ANN201 - a selenium WebDriver (selenium is imported here only)
    """A headless chromium WebDriver that plays media without a gesture and keeps the console log."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = ensure_chromium()
    o = webdriver.ChromeOptions()
    o.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--mute-audio",
                "--autoplay-policy=no-user-gesture-required", "--window-size=1400,1800",
                f"--user-data-dir={downloads}"):
        o.add_argument(arg)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=o, service=Service(driver))
