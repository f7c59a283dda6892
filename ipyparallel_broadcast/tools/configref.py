"""The configuration reference (``docs/config.md``), made from the traitlets
classes: every settable trait this package defines, with its type, default
and help. The page is committed, so that it reads on a forge as in the built
site; ``tests/test_configref.py`` fails when it differs from what this makes.

    python -m ipyparallel_broadcast.tools.configref docs/config.md
"""

from __future__ import annotations

import argparse
import importlib
import sys

PACKAGE = "ipyparallel_broadcast"
IPP_REFERENCE = "https://ipyparallel.readthedocs.io/en/latest/reference/details.html"

INTRO = f"""# Configuration reference

Every setting this package adds, made from its traitlets classes
(`python -m ipyparallel_broadcast.tools.configref docs/config.md`). Set them as on any
IPython Parallel application: a command-line flag (`--BroadcastController.depth=2`), a
profile's config file (`c.BroadcastController.depth = 2` in `ipcontroller_config.py` or
`ipcluster_config.py`), or a keyword of `ipb.Cluster`. IPython Parallel's own settings
(`IPController.*`, `IPEngine.*`, `HeartMonitor.*`, ...) apply as documented in
[its reference]({IPP_REFERENCE}).
"""

# (heading, what the section says first, the classes whose settings it lists)
SECTIONS = [
    (
        "The controller: `BroadcastController`",
        "`python -m ipyparallel_broadcast.controller`, or `ipcluster start --controller=broadcast`.\n"
        "The tree's shape, its heartbeats, the hub's records and the paths big data takes:",
        ["ipyparallel_broadcast.controller.app:BroadcastController"],
    ),
    (
        "The engines: `BroadcastEngine`",
        "`python -m ipyparallel_broadcast.engine` (IPython Parallel's `ipengine`, plus these; its kernel's\n"
        "as `c.BroadcastKernel.<name>`):",
        ["ipyparallel_broadcast.engine.app:BroadcastEngine", "ipyparallel_broadcast.engine.kernel:BroadcastKernel"],
    ),
    (
        "The client: `Client`",
        "Keywords of `ipb.Client(...)`, or `c.Client.<name>` in the profile's `ipcontroller_client` config:",
        ["ipyparallel_broadcast.client.client:Client"],
    ),
    (
        "The launchers",
        "`ipcluster start --controller=broadcast --engines=broadcast`, or `ipb.Cluster`:",
        [
            "ipyparallel_broadcast.launch.launcher:BroadcastControllerLauncher",
            "ipyparallel_broadcast.launch.launcher:BroadcastEngineSetLauncher",
        ],
    ),
    (
        "Under Slurm",
        '`ipcluster start` with `c.Cluster.controller_launcher_class = "broadcast-slurm"` and\n'
        '`c.Cluster.engine_launcher_class = "broadcast-slurm"` (see\n'
        "[deployment](guide/deploy-slurm.md)); IPython Parallel's `SlurmLauncher` settings\n"
        "(`account`, `qos`, `timelimit`, `options`, `batch_template`) apply as well:",
        ["ipyparallel_broadcast.launch.batch:BroadcastSlurmEngineSetLauncher"],
    ),
]


def _class(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def own_config_traits(cls) -> dict:
    """``{name: trait}`` of the class's settable traits defined in this package, in class order."""
    out = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith(PACKAGE):
            continue
        for name, trait in vars(klass).items():
            if getattr(trait, "metadata", {}).get("config") and hasattr(trait, "default_value_repr"):
                out[name] = cls.class_traits()[name]
    return out


def entries(cls) -> list[str]:
    """One Markdown list item per setting: name, type, default, help."""
    items = []
    for name, trait in own_config_traits(cls).items():
        help_text = " ".join((trait.help or "").split()) or "(no help)"
        default = trait.default_value_repr().replace(sys.executable, "python").replace("`", "'")  # (any machine's)
        items.append(f"- **`{cls.__name__}.{name}`** ({type(trait).__name__}, default `{default}`): {help_text}")
    if not items:
        raise ValueError(f"{cls.__module__}.{cls.__name__} has no settings of {PACKAGE}'s own")
    return items


def render() -> str:
    parts = [INTRO]
    for heading, prose, classes in SECTIONS:
        parts.append(f"## {heading}\n\n{prose}\n")
        for path in classes:
            parts.append("\n".join(entries(_class(path))) + "\n")
    return "\n".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the page to write (docs/config.md)")
    args = ap.parse_args(argv)
    with open(args.out, "w") as f:
        f.write(render())


if __name__ == "__main__":
    main()
