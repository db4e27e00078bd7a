"""A real headless browser for the tests: Debian's chromium driven by Selenium.

`screenshot()` opens a page the way a person does (JavaScript, the app's own API calls) with an
HTTP basic login sent on every request, waits for a text to appear, and saves a PNG. Setup's
`browser` step installs chromium and its driver (`scripts/setup.sh browser`); without them the
call fails with that instruction.
"""

from __future__ import annotations

import base64
import shutil
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


class BrowserMissingError(RuntimeError):
    """chromium or chromedriver is not installed."""


def _driver(width: int, height: int):  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for binary in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(binary):
            raise BrowserMissingError(f"{binary} is missing: run `scripts/setup.sh browser` (apt)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def screenshot(
    url: str,
    out: Path,
    *,
    login: tuple[str, str] | None = None,
    wait_for: tuple[str, ...] = (),
    wait_css: tuple[str, ...] = (),
    timeout: float = 60.0,
    size: tuple[int, int] = (1400, 900),
) -> str:
    """Open `url`, wait until every text in `wait_for` is on the page and every CSS selector in
    `wait_css` matches an element (a drawn chart's lines, say), then save a PNG at `out`.

    Returns the page's visible text. Raises TimeoutError naming the missing texts (with the
    page's text) when they do not show within `timeout`; the screenshot is saved either way.
    """
    driver = _driver(*size)
    try:
        if login:
            token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd(
                "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}}
            )
        driver.get(url)
        deadline = time.monotonic() + timeout
        text = ""
        while True:
            text = driver.find_element("tag name", "body").text
            missing = [w for w in wait_for if w not in text] + [
                css for css in wait_css if not driver.find_elements("css selector", css)
            ]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
        if missing:
            raise TimeoutError(
                f"{url}: {missing} not shown within {timeout:.0f} s; page: {text[:600]!r}"
            )
        return str(text)
    finally:
        driver.quit()
