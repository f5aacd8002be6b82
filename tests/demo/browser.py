"""Headless Chromium for tests and for the README's screenshot: render a local HTML file,
take a screenshot, and collect what the page wrote to the console.

``python -m tests.demo.browser PAGE.html OUT.png`` writes the screenshot, cropped to the
page's content (``make demo-screenshot`` uses it).

Chromium is Debian's ``chromium`` package (``make test`` installs it when it runs as root);
:func:`chromium_or_reason` says why it cannot run here, for a skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

#: Flags that work on this project's machines (no GPU, no sandbox as root, no network).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
)
CONSOLE_LINE = re.compile(r":CONSOLE[:(]")
WIDTH_PX = 1280
MAX_HEIGHT_PX = 6000


def chromium_or_reason() -> tuple[str | None, str]:
    """(path of chromium, "") or (None, why it cannot be used here)."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path is not None:
            return path, ""
    return None, (
        "headless Chromium is not installed (Debian: apt-get install -y chromium; "
        "`make test` installs it when run as root)"
    )


@dataclass(frozen=True)
class Rendered:
    screenshot: Path
    console: list[str]  #: console messages and uncaught errors the page produced
    log: str


def render(page: Path, screenshot: Path, *, height_px: int = MAX_HEIGHT_PX) -> Rendered:
    chromium, reason = chromium_or_reason()
    if chromium is None:
        raise RuntimeError(reason)
    with tempfile.TemporaryDirectory(prefix="stream-dp-chromium-") as profile:
        done = subprocess.run(
            [chromium, *FLAGS, f"--user-data-dir={profile}",
             f"--window-size={WIDTH_PX},{height_px}", f"--screenshot={screenshot}",
             page.resolve().as_uri()],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    log = done.stdout + done.stderr
    if done.returncode != 0 or not screenshot.exists():
        raise RuntimeError(f"chromium failed ({done.returncode}):\n{log[-3000:]}")
    console = [line for line in log.splitlines() if CONSOLE_LINE.search(line)]
    return Rendered(screenshot, console, log)


def crop_to_content(path: Path, margin_px: int = 24) -> None:
    """Cut the blank space below the page's content."""
    with Image.open(path) as image:
        rgb = image.convert("RGB")
        inverted = Image.eval(rgb, lambda v: 255 - v)
        box = inverted.getbbox()
        if box is None:
            return
        bottom = min(rgb.height, box[3] + margin_px)
        rgb.crop((0, 0, rgb.width, bottom)).save(path, optimize=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.demo.browser PAGE.html OUT.png", file=sys.stderr)
        return 2
    page, out = Path(argv[0]), Path(argv[1])
    rendered = render(page, out)
    if rendered.console:
        print("\n".join(rendered.console), file=sys.stderr)
        return 1
    crop_to_content(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
