"""The documentation site builds with warnings as errors, its notebooks and its
getting-started page executed as written (the example notebooks run here, as a
user would open them), and a browser finds every page whole.

The build is ``python -m sphinx -W --keep-going docs <out>``, once for the module.
"""

import glob
import html.parser
import os
import subprocess
import sys
from urllib.parse import unquote, urlparse

import pytest
from cluster_util import skip_or_fail

pytestmark = pytest.mark.cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    figures = tmp_path_factory.mktemp("figures")
    env = dict(
        os.environ,
        IPB_DEMO_ENGINES="4",
        IPB_FIGURE=str(figures / "benchmark_results.png"),
        IPB_BIGPUSH_FIGURE=str(figures / "bigpush-hosts.png"),
    )
    cmd = [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html", DOCS, str(out / "html")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return dict(done=done, html=out / "html", executed=out / "jupyter_execute", figures=figures)


def executed(site, name):
    import nbformat  # (the docs extra: a pure test run need not install it)

    return nbformat.read(str(site["executed"] / name), as_version=4)


def stream_text(nb):
    """What the cells printed: streams, and ``%px``'s per-engine displays."""
    return "".join(
        o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type in ("stream", "display_data")
    )


def results_text(nb):
    return "\n".join(
        o.get("data", {}).get("text/plain", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "execute_result"
    )


def test_the_site_builds_without_a_warning(site):
    done = site["done"]
    assert done.returncode == 0, done.stderr[-5000:]
    pages = {os.path.relpath(p, site["html"]) for p in glob.glob(str(site["html"] / "**" / "*.html"), recursive=True)}
    wanted = {"index.html", "getting-started.html", "from-directview.html", "architecture.html", "benchmarks.html"}
    wanted |= {"api.html", "config.html", "changelog.html", "guide/index.html", "examples/broadcast_demo.html"}
    assert wanted <= pages
    results = glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.md"))
    assert len([p for p in pages if p.startswith("results/")]) == len(results)  # a page per result file


def test_getting_started_runs_as_written(site):
    nb = executed(site, "getting-started.ipynb")
    results, printed = results_text(nb), stream_text(nb)
    assert "120" in results  # the in-tree sum of 0..15
    assert "[0, 1, 4, 9, 16, 25, 36, 49]" in results  # map
    assert "[42, 42, 42, 42]" in results  # the streaming view, 4 engines
    assert printed.count("hello from") == 4  # %px on every engine
    assert "4 engines raised ZeroDivisionError" in printed
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []


def test_the_notebooks_ran_with_their_outputs(site):
    demo = stream_text(executed(site, "examples/broadcast_demo.ipynb"))
    assert "broadcast tree: depth=2 fanout=2" in demo
    assert "Batch(count=2" in demo  # every reply mode ran
    assert "pending 0" in demo
    results = executed(site, "examples/benchmark_results.ipynb")
    images = [o for c in results.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 3  # by engine count/depth/size for each machine, and the farm
    figure = site["figures"] / "benchmark_results.png"
    assert figure.stat().st_size > 10_000 and figure.read_bytes()[:4] == b"\x89PNG"
    tree = executed(site, "examples/live_tree.ipynb")
    assert any("text/html" in o.get("data", {}) for c in tree.cells for o in c.get("outputs", []))


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("href", "src"):
            if a.get(key) and tag in ("a", "img", "link", "script"):
                self.links.append(a[key])


def test_every_local_link_and_image_resolves(site):
    broken = []
    for page in glob.glob(str(site["html"] / "**" / "*.html"), recursive=True):
        if os.path.relpath(page, site["html"]).startswith(("_static", "_sources")):
            continue  # the theme's templates, not pages
        parser = _Links()
        with open(page, encoding="utf-8") as f:
            parser.feed(f.read())
        for link in parser.links:
            url = urlparse(link)
            if url.scheme or url.netloc or not url.path:
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(page), unquote(url.path)))
            if not os.path.exists(target):
                broken.append(f"{os.path.relpath(page, site['html'])}: {link}")
    assert broken == []


def test_a_browser_shows_each_main_page_whole(site):
    from ipyparallel_broadcast.tools.screenshot import chromium

    try:
        browser = chromium()
    except FileNotFoundError as e:
        skip_or_fail(str(e), "the docs site in a browser")
    pages = {
        "index.html": "One call to hundreds",
        "getting-started.html": "hello from",
        "from-directview.html": "What stays the same",
        "api.html": "broadcast_view",
        "config.html": "BroadcastController.depth",
        "examples/live_tree.html": "broadcast tree",
    }
    for page, text in pages.items():
        url = "file://" + str(site["html"] / page)
        dom = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        assert "<h1>" in dom or "<h1 " in dom, page
        assert text in dom, page
        assert "bd-sidebar" in dom and "bd-article" in dom, page  # the theme's layout rendered
