"""The ``show`` page in a real headless browser (Debian's chromium through Selenium), used as a person would: it
opens offline, an episode plays, its videos advance together and the plots' cursors follow them, a seek shows the
right frame, and the dataset's hostile text stays text. A screenshot is kept as the test's artifact.

The browser is installed by the test's setup when missing (`browser.ensure_chromium`: apt-get, as root), never
skipped. Waits are bounded (a slow machine waits longer), and what is asserted is counted, not timed.
"""

from __future__ import annotations

import numpy as np
import pytest
from browser import headless_chromium
from selenium.webdriver.common.by import By
from showdata import HOSTILE, hostile_split, write

from episodepipes.sharding.formats.synthetic import SyntheticReader
from episodepipes.sharding.show import show

SHAPE = dict(num_episodes=3, length=100, height=96, width=128, fps=10.0)  # 10 s: a slow machine polls mid-play
WAIT = 90  # seconds a wait may take at most on a loaded machine; nothing asserts how long it took


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    base = tmp_path_factory.mktemp("show-browser")
    out = write(base / "h264", codec="h264", hostile=True, **SHAPE)
    split = hostile_split(out)
    return show(out, ["ep0002", "ep0000"], page_path=base / "page.html").page, split


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    d = headless_chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield d
    d.quit()


def until(driver, script: str, *args: object) -> object:
    """Wait (at most `WAIT` seconds) until ``script`` returns something truthy in the page, and return it."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(lambda d: d.execute_script(script, *args))


PIXELS = """var v = window.episodepipesShow.episodes[0].videos[arguments[0]];
var c = document.createElement("canvas"); c.width = v.videoWidth; c.height = v.videoHeight;
var g = c.getContext("2d"); g.drawImage(v, 0, 0);
return Array.from(g.getImageData(0, 0, c.width, c.height).data);"""


def test_an_episode_plays_with_its_plots_cursor_following(page, driver, tmp_path, record_property, capsys):
    path, split = page
    driver.get(path.as_uri())
    until(driver, "return window.episodepipesShow && window.episodepipesShow.ready")
    ep = "window.episodepipesShow.episodes[0]"
    n_videos, n_plots, cursor = driver.execute_script(f"var e = {ep}; return [e.videos.length, e.plots.length, "
                                                      "e.cursor()]")
    assert (n_videos, n_plots, cursor) == (2, 3, [0, 0, 0])
    assert driver.execute_script(f"return {ep}.videos.map(v => [v.videoWidth, v.videoHeight, v.duration])") == \
        [[128, 96, pytest.approx(10.0, abs=0.11)]] * 2  # decoded by the browser: H.264 plays in chromium

    button = driver.find_element(By.CSS_SELECTOR, "#episode-0 button.play")
    button.click()  # as a person would: the page's own play button
    label, ended = until(driver, f"var e = {ep}; return e.time() > 1.0 && "
                         "[document.querySelector('#episode-0 button.play').textContent, e.videos[0].ended]")
    assert label == ("play" if ended else "pause")  # the video advances ...
    if not ended:  # (a machine slow enough to let it end has nothing to pause: the cursors stand at its end)
        button.click()
    t = until(driver, f"var e = {ep}; var t = e.time(); return e.cursor().every(x => x === t) && t")
    assert 1.0 < t <= 10.0  # ... and, once paused, every plot's cursor stands at the video's time
    other = driver.execute_script(f"return {ep}.videos[1].currentTime")
    assert abs(other - t) <= 1 / SHAPE["fps"]  # the second camera follows the first within a frame
    readout = driver.execute_script("return document.querySelector('#episode-0 span.time').textContent")
    assert readout == f"{t:.2f} s, frame {min(SHAPE['length'] - 1, int(t * SHAPE['fps'] + 1e-6))}"

    scrub = driver.find_element(By.CSS_SELECTOR, "#episode-0 input.scrub")  # the scrubber moves every video ...
    driver.execute_script("arguments[0].value = 1.5; arguments[0].dispatchEvent(new Event('input'))", scrub)
    until(driver, f"var e = {ep}; return e.videos.every(v => v.currentTime === 1.5) && "
                  "e.cursor().every(x => x === 1.5)")  # ... and every cursor follows
    frame = 25  # a seek shows the frame of that time
    at = (frame + 0.5) / SHAPE["fps"]
    driver.execute_script(f"{ep}.seek(arguments[0])", at)
    until(driver, f"var e = {ep}; return e.videos.every(v => !v.seeking && v.readyState >= 2) && "
                  "e.cursor().every(x => x === arguments[0])", at)
    source = SyntheticReader(**SHAPE).read("ep0002")
    frames = [f.astype(int) for f in source.cameras["front"]]
    shown = np.array(driver.execute_script(PIXELS, 0), dtype=int).reshape(96, 128, 4)[..., :3]
    errors = [np.abs(shown - f).mean() for f in frames]
    assert int(np.argmin(errors)) == frame and errors[frame] < 16  # the frame of that time, on screen

    # the dataset's text is shown as text, and none of it ran
    assert driver.execute_script("return [typeof window.pwned, document.images.length]") == ["undefined", 0]
    body = driver.execute_script("return document.body.innerText")
    assert f"prompt {HOSTILE}" in body and split in body
    problems = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert problems == []  # no script error, no blocked load (the CSP would name it)

    shot = tmp_path / "show-page.png"
    assert driver.save_screenshot(str(shot))
    record_property("screenshot", str(shot))  # in a junit report (--junitxml) too
    with capsys.disabled():  # shown in every run's output, not only a failing one's
        print(f"\nscreenshot of the show page: {shot}")
