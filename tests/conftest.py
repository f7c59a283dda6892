import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# engines import the modules of functions defined in tests
_path = os.environ.get("PYTHONPATH", "")
if HERE not in _path.split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, _path) if p)
