"""A notebook's outputs as a browser shows them: run it, export it to HTML,
and have headless Chromium take a screenshot.

    python -m ipyparallel_broadcast.tools.screenshot notebooks/live_tree.ipynb docs/jupyter-reprs.png

Needs ``nbclient``, ``nbconvert`` and a Chromium (``apt-get install chromium``).
Input cells are left out of the page: what is shown is what the reprs render.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def chromium() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError(f"no Chromium found (looked for {', '.join(BROWSERS)}): apt-get install chromium")


def run_notebook(path: str, timeout: int = 600):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}},
    ).execute()
    return nb


def to_html(nb) -> str:
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    return exporter.from_notebook_node(nb)[0]


def screenshot(page: str, png: str, width: int = 1000, height: int = 1800) -> str:
    """Chromium's picture of an HTML text, ``width`` x ``height`` pixels."""
    with tempfile.TemporaryDirectory(prefix="ipb-shot-") as tmp:
        html_path = os.path.join(tmp, "page.html")
        with open(html_path, "w") as f:
            f.write(page)
        cmd = [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp}/profile",
            f"--window-size={width},{height}",
            f"--screenshot={os.path.abspath(png)}",
            "file://" + html_path,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode or not os.path.exists(png):
            raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr[-2000:]}")
    return png


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook")
    parser.add_argument("png")
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--height", type=int, default=1800)
    args = parser.parse_args(argv)
    screenshot(to_html(run_notebook(args.notebook)), args.png, args.width, args.height)
    print(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
