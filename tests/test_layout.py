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


def test_no_class_grows_past_250_lines():
    """Split by concern, as h11 keeps events, state and connection apart."""
    import ast

    top = os.path.join(ROOT, "ipyparallel_broadcast")
    big = []
    for folder, _, files in os.walk(top):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    tree = ast.parse(f.read())
                big += [(os.path.relpath(path, top), node.name, node.end_lineno - node.lineno + 1)
                        for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                        and node.end_lineno - node.lineno + 1 > 250]
    assert big == []
