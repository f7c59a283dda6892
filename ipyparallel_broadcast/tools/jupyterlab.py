"""JupyterLab with IPython Parallel's cluster panel, driven in headless Chromium.

    python -m ipyparallel_broadcast.tools.jupyterlab docs/jupyterlab-broadcast.png

A JupyterLab server in a directory of its own (``Lab``), with an IPython
profile ``broadcast`` whose ``ipcluster_config.py`` names our launchers, and a
notebook. ``drive`` does what a user does: open the notebook, open the
IPython Parallel tab, press the profile's START, insert the panel's client
code, run every cell, and read the outputs from the page; then STOP. Needs
``jupyterlab``, ``playwright`` (its driver only: the browser is the system's
Chromium) and ``apt-get install chromium``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from .netbed import Managed

PROFILE = "broadcast"
ENGINES = 4
CONFIG = f"""
c.Cluster.controller_launcher_class = "broadcast"
c.Cluster.engine_launcher_class = "broadcast"
c.Cluster.n = {ENGINES}
c.BroadcastController.depth = 1
"""
TITLE = (
    "# A broadcast cluster from the panel\n\n"
    "START in the IPython Parallel tab, then its `<>` button inserts the client code."
)
CELLS = [
    "import ipyparallel_broadcast as ipb\n"
    "from ipyparallel_broadcast.client.display import grouping\n"
    "grouping.GROUP_ABOVE = 2  # group outputs from 3 engines, so 4 show it\n"
    "rc = ipb.Client(rc)  # the panel's stock client, made ours\n"
    f"rc.wait_for_engines({ENGINES})\n"
    "view = rc.broadcast_view(block=True)\n"
    "view.activate()\n"
    'print("view:", type(view).__module__, type(view).__name__)',
    '%px print("odd" if get_ipython().kernel.engine_id % 2 else "even")',
    "rc.broadcast_tree()",
    'view.reduce(lambda: 1, op="sum", block=True)',
]
BINARIES = ("/usr/lib/chromium/chromium", "/usr/lib/chromium-browser/chromium-browser")


def browser_binary() -> str | None:
    """Chromium's own binary (Debian's ``/usr/bin/chromium`` is a wrapper script)."""
    return next((b for b in BINARIES if os.access(b, os.X_OK)), None) or shutil.which("chromium")


def available() -> str | None:
    """None if JupyterLab can be driven here, else why not."""
    for module in ("jupyterlab", "playwright"):
        try:
            __import__(module)
        except ImportError:
            return f"the JupyterLab test needs {module} (pip install -e '.[browser]')"
    if browser_binary() is None:
        return "the JupyterLab test needs Chromium (apt-get install chromium)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab(Managed):
    """A JupyterLab server on localhost; its files, IPython profile and logs in ``root``."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="ipb-lab-")
        self.token, self.port = secrets.token_hex(16), free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120):
        import nbformat

        profile = os.path.join(self.root, "ipython", f"profile_{PROFILE}")
        os.makedirs(profile)
        with open(os.path.join(profile, "ipcluster_config.py"), "w") as f:
            f.write(CONFIG)
        cells = [nbformat.v4.new_markdown_cell(TITLE)] + [nbformat.v4.new_code_cell(c) for c in CELLS]
        nb = nbformat.v4.new_notebook(cells=cells)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, os.path.join(self.root, "broadcast.ipynb"))
        settings = os.path.join(self.root, "settings", "@jupyterlab", "apputils-extension")
        os.makedirs(settings)
        with open(os.path.join(settings, "notification.jupyterlab-settings"), "w") as f:
            f.write('{"fetchNews": "false"}')  # no news prompt over the page
        env = dict(
            os.environ,
            JUPYTERLAB_SETTINGS_DIR=os.path.join(self.root, "settings"),
            IPYTHONDIR=os.path.join(self.root, "ipython"),
            JUPYTER_CONFIG_DIR=os.path.join(self.root, "config"),
            JUPYTER_RUNTIME_DIR=os.path.join(self.root, "runtime"),
        )
        argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1"]
        argv += [f"--port={self.port}", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not come up; see {self.log_path}")
            time.sleep(0.1)

    @property
    def log_path(self) -> str:
        return os.path.join(self.root, "lab.log")

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=1)
        except OSError:
            return False
        return True

    def cluster_processes(self) -> list[str]:
        """The server's descendants but its kernels: the clusters it started
        (controller, relay nodes, engines, nannies)."""
        import psutil

        found = []
        for proc in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                cmd = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if "ipykernel_launcher" not in cmd:
                found.append(cmd)
        return found

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # the server stops the clusters it started
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def drive(lab: Lab, screenshot: str | None = None, timeout: float = 120) -> dict:
    """Start the profile's cluster from the panel, run the notebook, stop the
    cluster; what the page showed: ``state``, ``code`` (the injected cell),
    ``outputs`` (each cell's text), ``stopped``; and ``processes``, the
    cluster's before STOP."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    ms = timeout * 1000
    item = f'li[data-cluster-id="{PROFILE}:"]'
    seen: dict = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_binary(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{lab.url}/lab/tree/broadcast.ipynb?token={lab.token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=ms)
            page.click('.lm-TabBar-tab[data-id="ipp-cluster-launcher"]')
            page.click(f"{item} .ipp-ClusterListingItem-start", timeout=ms)
            page.wait_for_selector(f"{item} >> text=State: running", timeout=ms)
            with contextlib.suppress(PlaywrightTimeout):  # the panel counts the engines as their sets start
                page.wait_for_selector(f"{item} >> text=Number of engines: {ENGINES}", timeout=ms)
            seen["state"] = page.inner_text(item)  # (what it shows: the test checks it)
            page.click(".jp-Notebook .jp-CodeCell >> nth=0")
            page.click(f"{item} .ipp-ClusterListingItem-code")  # inserted above the active cell
            cells = len(CELLS) + 2  # the title, and the panel's cell
            page.wait_for_function(f"document.querySelectorAll('.jp-Notebook .jp-Cell').length == {cells}")
            seen["code"] = page.inner_text(".jp-Notebook .jp-Cell >> nth=1")
            page.click("text=Run", timeout=ms)
            page.click("text=Run All Cells", timeout=ms)
            last = f"document.querySelectorAll('.jp-Notebook .jp-Cell .jp-InputPrompt')[{cells - 1}]"
            page.wait_for_function(f"/\\[\\d+\\]/.test({last}?.innerText || '')", timeout=ms)
            areas = page.query_selector_all(".jp-Notebook .jp-CodeCell .jp-OutputArea")
            seen["outputs"] = [o.inner_text() for o in areas]
            if screenshot:
                page.screenshot(path=screenshot, full_page=True)
            seen["processes"] = len(lab.cluster_processes())
            page.click(f"{item} .ipp-ClusterListingItem-stop", timeout=ms)
            page.wait_for_selector(f"{item} >> text=State: Stopped", timeout=ms)
            seen["stopped"] = page.inner_text(item)
        finally:
            browser.close()
    return seen


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("png", help="where the screenshot goes (e.g. docs/jupyterlab-broadcast.png)")
    args = parser.parse_args(argv)
    with Lab() as lab:
        seen = drive(lab, screenshot=args.png)
    print("\n---\n".join(seen["outputs"]))


if __name__ == "__main__":
    main()
