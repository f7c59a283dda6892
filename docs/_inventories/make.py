"""Make the intersphinx inventories the docs build reads (it needs no network).

    apt-get install python3.11-doc python-ipyparallel-doc
    python docs/_inventories/make.py

- ``python.inv``: Debian's python3.11-doc (the CPython docs' own inventory);
- ``ipyparallel.inv``: Debian's python-ipyparallel-doc (IPython Parallel's own
  inventory, from its 7.1 docs: the names this site links to are unchanged);
- ``numpy.inv``: no Debian package ships NumPy's, so it is written here for
  NumPy's public callables and classes, at the pages NumPy's docs give them
  (``reference/generated/numpy.<name>.html``).
"""

import os
import shutil

import numpy as np
import sphobjinv as soi

HERE = os.path.dirname(os.path.abspath(__file__))
DEBIAN = {
    "python.inv": "/usr/share/doc/python3.11/html/objects.inv",
    "ipyparallel.inv": "/usr/share/doc/python-ipyparallel-doc/html/objects.inv",
}


def numpy_inventory():
    inv = soi.Inventory()
    inv.project, inv.version = "NumPy", np.__version__
    for name in sorted(dir(np)):
        obj = getattr(np, name, None)
        if name.startswith("_") or obj is None:
            continue
        role = "class" if isinstance(obj, type) else "function" if callable(obj) else None
        if role:
            uri = f"reference/generated/numpy.{name}.html#$"
            inv.objects.append(
                soi.DataObjStr(name=f"numpy.{name}", domain="py", role=role, priority="1", uri=uri, dispname="-")
            )
    return inv


def main():
    for name, source in DEBIAN.items():
        shutil.copyfile(source, os.path.join(HERE, name))
    inv = numpy_inventory()
    soi.writebytes(os.path.join(HERE, "numpy.inv"), soi.compress(inv.data_file(contract=True)))
    for name in (*DEBIAN, "numpy.inv"):
        found = soi.Inventory(os.path.join(HERE, name))
        print(f"{name}: {found.project} {found.version}, {found.count} objects")


if __name__ == "__main__":
    main()
