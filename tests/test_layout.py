"""The package is grouped by process role, and its imports go one way.

The contracts are in ``pyproject.toml`` (``[tool.importlinter]``); this runs
them, so the README's test command checks them too."""

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.pure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES = ["wire", "host", "compat", "relay", "engine", "client", "controller", "launch", "tools"]


def test_imports_go_one_way():
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    assert lint, "import-linter is a test dependency (pip install -e '.[test]')"
    done = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_every_module_lives_in_a_role():
    """Nothing but the package's front door sits at its top level."""
    top = os.path.join(ROOT, "ipyparallel_broadcast")
    loose = sorted(f for f in os.listdir(top) if f.endswith(".py") and f != "__init__.py")
    assert loose == []
    assert sorted(d for d in os.listdir(top) if os.path.isfile(os.path.join(top, d, "__init__.py"))) == sorted(ROLES)


@pytest.mark.parametrize("role", ROLES)
def test_each_role_says_who_runs_it(role):
    import importlib

    doc = importlib.import_module(f"ipyparallel_broadcast.{role}").__doc__ or ""
    assert len(doc.split()) >= 12, f"ipyparallel_broadcast/{role}/__init__.py: say which process runs it"


def _class_defs():
    """``(module path, ast.ClassDef)`` of every class of the package, nested ones too."""
    import ast

    top = os.path.join(ROOT, "ipyparallel_broadcast")
    for folder, _, files in os.walk(top):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    tree = ast.parse(f.read())
                yield from ((os.path.relpath(path, top), n) for n in ast.walk(tree) if isinstance(n, ast.ClassDef))


def test_no_class_grows_past_250_lines():
    """Split by concern, as h11 keeps events, state and connection apart."""
    sizes = [(where, node.name, node.end_lineno - node.lineno + 1) for where, node in _class_defs()]
    assert [size for size in sizes if size[2] > 250] == []


def test_the_center_holds_its_parts_and_inherits_only_its_settings():
    """The Client and the controller are made of parts they hold (each owning
    its state), not of mixins sharing ``self``: each class's bases are its
    settings (traits: traitlets reads ``c.Client.*`` from the class's own) and
    the upstream class, or the seam over it."""
    from ipyparallel.controller.app import IPController

    from ipyparallel_broadcast.client.client import Client
    from ipyparallel_broadcast.client.settings import Settings
    from ipyparallel_broadcast.controller.app import BroadcastController
    from ipyparallel_broadcast.controller.settings import TreeSettings

    assert Client.__bases__ == (Settings,)
    assert BroadcastController.__bases__ == (TreeSettings, IPController)


def test_no_two_classes_of_the_package_share_a_name():
    """A class's name finds its one place: ``grep 'class Replies'`` once found two."""
    where: dict[str, list[str]] = {}
    for path, node in _class_defs():
        where.setdefault(node.name, []).append(path)
    assert {name: places for name, places in where.items() if len(places) > 1} == {}


def _written_imports():
    """Every ``import``/``from`` of this package in the notebooks, docs, README
    and scripts: a move inside the package must not leave them behind."""
    import json
    import re

    pattern = re.compile(
        r"^\s*(?:from\s+(ipyparallel_broadcast[\w.]*)\s+import\s+([\w, ]+)"
        r"|import\s+(ipyparallel_broadcast[\w.]*))",
        re.M,
    )
    places = ["README.md", "notebooks", "docs", "benchmarks", "gce-scripts"]
    for place in places:
        path = os.path.join(ROOT, place)
        files = (
            [path]
            if os.path.isfile(path)
            else [
                os.path.join(d, f)
                for d, _, fs in os.walk(path)
                for f in fs
                if f.endswith((".py", ".md", ".rst", ".ipynb", ".sh"))
            ]
        )
        for name in sorted(files):
            with open(name, encoding="utf-8") as f:
                text = f.read()
            if name.endswith(".ipynb"):
                text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
            for m in pattern.finditer(text):
                yield os.path.relpath(name, ROOT), m.group(1) or m.group(3), m.group(2)


def test_every_test_module_says_what_it_tests_and_the_testing_page_names_it():
    import ast
    import glob

    with open(os.path.join(ROOT, "docs", "testing.md")) as f:
        page = f.read()
    unsaid, unnamed = [], []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))):
        name = os.path.basename(path)
        with open(path) as f:
            if not ast.get_docstring(ast.parse(f.read())):
                unsaid.append(name)
        if f"`{name}`" not in page:
            unnamed.append(name)
    assert (unsaid, unnamed) == ([], []), "a docstring for each test module, and a line in docs/testing.md"


def test_every_written_import_of_the_package_resolves():
    import importlib

    broken = []
    seen = 0
    for where, module, names in _written_imports():
        seen += 1
        try:
            mod = importlib.import_module(module)
            for name in (part.split()[0] for part in (names or "").split(",") if part.strip()):
                if not hasattr(mod, name):
                    importlib.import_module(f"{module}.{name}")
        except ImportError as e:
            broken.append(f"{where}: {module} {names or ''}: {e}")
    assert seen > 10
    assert broken == []


def _tool(name):
    found = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    assert found, f"{name} is a test dependency (pip install -e '.[test]')"
    return found


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_is_clean_on_the_whole_repository(command):
    """The lint CI and pre-commit run (rules in ``pyproject.toml``)."""
    done = subprocess.run([_tool("ruff"), *command, "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_a_host_relay_process_loads_neither_ipyparallel_nor_numpy():
    """A host relay is a process of its own on every engine host: it imports
    what relaying needs (zmq, jupyter_client's session), not IPython Parallel,
    IPython or NumPy (``compat/ipp.py`` imports upstream's privates when used)."""
    code = (
        "import sys, ipyparallel_broadcast.relay.hostshell, ipyparallel_broadcast.relay.shell\n"
        "print(sorted(m for m in ('numpy', 'ipyparallel', 'IPython', 'ipykernel') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_upstream_private_we_rely_on_still_exists():
    """``compat.ipp.uses()``: when IPython Parallel renames one, this says which."""
    import importlib

    from ipyparallel_broadcast.compat import ipp

    def names_in_code(cls) -> set:  # attribute names its own methods store or read
        return {
            name
            for klass in cls.__mro__
            for f in vars(klass).values()
            if hasattr(f, "__code__")
            for name in f.__code__.co_names
        }

    missing = []
    for where in ipp.uses():
        module, _, dotted = where.partition(":")
        owner, _, member = dotted.rpartition(".")
        found = importlib.import_module(module)
        if owner:
            found = getattr(found, owner)
            if not (hasattr(found, member) or member in names_in_code(found)):
                missing.append(where)
        elif not hasattr(found, member):
            missing.append(where)
    assert missing == []
    for seam in ipp.BASES:  # and each seam class builds on this IPython Parallel
        assert getattr(ipp, seam).__mro__[1].__name__ == ipp.BASES[seam].rsplit(":", 1)[1]


def _private_names_of(*classes) -> set:
    names = set()
    for cls in classes:
        names |= {n for n in dir(cls) if n.startswith("_") and not n.startswith("__")}
        for klass in cls.__mro__:
            for f in vars(klass).values():
                names |= {n for n in getattr(getattr(f, "__code__", None), "co_names", ()) if n.startswith("_")}
    return {n for n in names if not n.startswith("__")}


def test_upstream_privates_appear_only_in_their_seam():
    """No module but ``compat/ipp.py`` names a private member of IPython
    Parallel's client, views, results, engine, hub, record store or util, and
    none but ``compat/ipykernel.py`` and ``compat/pyzmq.py`` one of ipykernel's
    kernel or pyzmq's stream (names the package defines itself aside)."""
    import re

    import ipyparallel.util
    from ipykernel.ipkernel import IPythonKernel
    from ipyparallel.client.asyncresult import AsyncMapResult, AsyncResult
    from ipyparallel.client.client import Client
    from ipyparallel.client.futures import MessageFuture
    from ipyparallel.client.view import DirectView
    from ipyparallel.controller.dictdb import DictDB
    from ipyparallel.controller.hub import Hub
    from ipyparallel.engine.app import IPEngine
    from traitlets.config import Application
    from zmq.eventloop.zmqstream import ZMQStream

    traitlets = _private_names_of(Application) | set(vars(Application()))  # theirs, through HasTraits
    upstream = {
        "ipp": _private_names_of(Client, DirectView, AsyncResult, AsyncMapResult, MessageFuture, IPEngine, Hub, DictDB)
        - traitlets
        | {n for n in vars(ipyparallel.util) if n.startswith("_") and not n.startswith("__")},
        "ipykernel": _private_names_of(IPythonKernel) - traitlets,
        "pyzmq": _private_names_of(ZMQStream),
    }
    ours, used, imported = set(), {}, {}
    top = os.path.join(ROOT, "ipyparallel_broadcast")
    for folder, _, files in os.walk(top):
        for name in files:
            if not name.endswith(".py"):
                continue
            where = os.path.relpath(os.path.join(folder, name), top)
            with open(os.path.join(folder, name)) as f:
                text = f.read()
            if not where.startswith("compat"):
                defined = r"def (_\w+)|(?:self|cls)\.(_\w+)\s*=(?!=)|^\s+(_\w+)\s*[:=]|^(_\w+)\s*="
                for m in re.finditer(defined, text, re.M):
                    ours.add(next(g for g in m.groups() if g))
            for m in re.finditer(r"\.(_[a-z]\w*)", text):
                used.setdefault(m.group(1), set()).add(where)
            for m in re.finditer(r"^\s*from (ipyparallel|ipykernel|zmq)\S* import (.+)$", text, re.M):
                for name in re.findall(r"\b(_[a-z]\w*)", m.group(2)):
                    seam = {"ipyparallel": "ipp", "ipykernel": "ipykernel", "zmq": "pyzmq"}[m.group(1)]
                    imported.setdefault(name, set()).add((seam, where))
    misplaced = {}
    for seam, names in upstream.items():
        for n in names & set(used):
            if n in ours:
                continue
            outside = sorted(w for w in used[n] if w != f"compat/{seam}.py")
            if outside:
                misplaced[n] = outside
    for name, places in imported.items():  # ``from ipyparallel.x import _private``
        outside = sorted(w for seam, w in places if w != f"compat/{seam}.py")
        if outside:
            misplaced[name] = outside
    assert misplaced == {}


def test_no_two_parts_of_a_class_define_one_name_unless_they_chain():
    """A class made of mixins of ours (the Client, the controller): a method
    two of them define is either chained (each calls ``super()`` for it) or a
    silent override, one part's handler lost to the other's (as the roster's
    ``_on_notice`` once took the notices socket's). Chaining is checked in the
    source of every definition but the last in the MRO."""
    import inspect

    from ipyparallel_broadcast.client.client import Client
    from ipyparallel_broadcast.compat import ipp
    from ipyparallel_broadcast.controller.app import BroadcastController

    bound = {name for hooks in ipp.HOOKS.values() for name in hooks}  # the seam binds these to ours
    clashes = []
    for cls in (Client, BroadcastController):
        ours = [
            c
            for c in cls.__mro__
            if c.__module__.startswith("ipyparallel_broadcast") and not c.__module__.endswith(".compat.ipp")
        ]
        seen: dict[str, list[type]] = {}
        for part in ours:
            for name, value in vars(part).items():
                if inspect.isfunction(value) and not name.startswith("__") and name not in bound:
                    seen.setdefault(name, []).append(part)
        for name, parts in seen.items():
            for part in parts[:-1]:  # each but the last must hand on to the next
                source = inspect.getsource(vars(part)[name])
                if f"super().{name}(" not in source and f"super({part.__name__}, self).{name}(" not in source:
                    clashes.append(f"{cls.__name__}.{name}: {part.__name__} hides {parts[-1].__name__}'s")
    assert clashes == []
