"""Sphinx configuration: ``python -m sphinx -W --keep-going docs docs/_build/html``.

Markdown and notebooks by MyST (myst-nb), the PyData theme as IPython Parallel
uses, the API from docstrings (autodoc, napoleon), the configuration reference
committed as Markdown (``tools/configref.py`` makes it; a test checks it), intersphinx from local
inventories (``_inventories/``, made by ``_inventories/make.py``: the build
needs no network). The example notebooks are copied in from ``notebooks/`` and
executed during the build (``IPB_DOCS_EXECUTE=off`` renders them without
outputs, for a quick check of the pages).
"""

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import ipyparallel_broadcast  # noqa: E402

project = "ipyparallel-broadcast"
author = "the ipyparallel-broadcast developers"
copyright = "2026, " + author
release = version = ipyparallel_broadcast.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "_inventories", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# -- notebooks: the repository's, copied in and run at build time ---------
EXAMPLES = os.path.join(HERE, "examples")
os.makedirs(EXAMPLES, exist_ok=True)
for name in sorted(os.listdir(os.path.join(ROOT, "notebooks"))):
    if name.endswith(".ipynb"):
        shutil.copyfile(os.path.join(ROOT, "notebooks", name), os.path.join(EXAMPLES, name))
nb_execution_mode = os.environ.get("IPB_DOCS_EXECUTE", "force")
# the results notebook writes its figures; the committed ones are not the build's to change
_FIGURES = os.path.join(HERE, "_build", "figures")
os.makedirs(_FIGURES, exist_ok=True)
os.environ.setdefault("IPB_FIGURE", os.path.join(_FIGURES, "benchmark_results.png"))
os.environ.setdefault("IPB_BIGPUSH_FIGURE", os.path.join(_FIGURES, "bigpush-hosts.png"))
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True
# notebooks read ../benchmarks and ../docs as in the repository: run them from there
nb_execution_in_temp = False
nb_kernel_rgx_aliases = {".*": "python3"}

# -- API -------------------------------------------------------------------
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_numpy_docstring = True

# -- intersphinx, from local inventories ----------------------------------
INV = os.path.join(HERE, "_inventories")
intersphinx_mapping = {
    "python": ("https://docs.python.org/3.11", os.path.join(INV, "python.inv")),
    "ipyparallel": ("https://ipyparallel.readthedocs.io/en/latest", os.path.join(INV, "ipyparallel.inv")),
    "numpy": ("https://numpy.org/doc/stable", os.path.join(INV, "numpy.inv")),
}
intersphinx_timeout = 5

# -- HTML ------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "ipyparallel-broadcast"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_static_path = []

# -- the committed benchmark results, a page each --------------------------
RESULTS = os.path.join(HERE, "results")
os.makedirs(RESULTS, exist_ok=True)
for name in sorted(os.listdir(os.path.join(ROOT, "benchmarks", "results"))):
    if name.endswith(".md"):
        page = os.path.join(RESULTS, name)
        text = f"```{{include}} ../../benchmarks/results/{name}\n```\n"
        if not os.path.exists(page) or open(page).read() != text:
            with open(page, "w") as f:
                f.write(text)


# -- API: what this package defines; what it inherits is IPython Parallel's -----
def _defined_here(obj) -> bool | None:
    owner = getattr(obj, "this_class", None)  # a trait: the class that declares it
    target = owner or getattr(obj, "fget", None) or getattr(obj, "__func__", None) or obj
    module = getattr(target, "__module__", None)
    return None if module is None else module.startswith("ipyparallel_broadcast")


def _skip_foreign_members(app, what, name, obj, skip, options):
    if what == "class" and _defined_here(obj) is False:
        return True
    return None


# -- a figure's source: links to benchmarks/results/NAME.md (as they read on a forge)
# go to the results page built from that file, and say the commit that made it
from docutils import nodes  # noqa: E402
from myst_parser.sphinx_ext.myst_refs import MystReferenceResolver  # noqa: E402
from sphinx.transforms.post_transforms import SphinxPostTransform  # noqa: E402

RESULTS_SRC = os.path.join(ROOT, "benchmarks", "results")


def _result_commit(name: str) -> str:
    with open(os.path.join(RESULTS_SRC, name + ".md"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("Commit: "):
                return line.split()[1][:7]
    return "?"


class ResultsLinks(SphinxPostTransform):
    """A link to a results file becomes one to its page (before MyST resolves it)."""

    default_priority = MystReferenceResolver.default_priority - 1

    def run(self, **kwargs):
        from sphinx import addnodes

        for node in self.document.findall(addnodes.pending_xref):
            target = node.get("reftarget", "")
            head, _, name = target.rpartition("/")
            if node.get("refdomain") == "doc" and head.endswith("benchmarks/results"):
                if os.path.exists(os.path.join(RESULTS_SRC, name + ".md")):
                    node["reftarget"] = "results/" + name


class ResultsTitles(SphinxPostTransform):
    """Each link to a results page says, on hover, the commit its figures come from."""

    default_priority = MystReferenceResolver.default_priority + 1

    def run(self, **kwargs):
        for node in self.document.findall(nodes.reference):
            uri = node.get("refuri", "")
            name = uri.rpartition("results/")[2].partition(".html")[0]
            if "results/" in uri and os.path.exists(os.path.join(RESULTS_SRC, name + ".md")):
                node["reftitle"] = f"benchmarks/results/{name}.md, made at commit {_result_commit(name)}"


def setup(app):
    app.connect("autodoc-skip-member", _skip_foreign_members)
    app.add_post_transform(ResultsLinks)
    app.add_post_transform(ResultsTitles)
