"""``.. traitlets-config:: module:Class [as Name]``: a configuration reference
generated from a traitlets class, as IPython Parallel generates its own.

Lists the settable traits (``config=True``) that this package defines on the
class or its bases, each under the name a user sets it by (``Name.trait``,
Name defaulting to the class's), with its type, default and help.
"""

import importlib

from docutils.parsers.rst import Parser
from docutils.utils import new_document
from sphinx.util.docutils import SphinxDirective

PACKAGE = "ipyparallel_broadcast"


def _class(path):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def own_config_traits(cls):
    """``{name: trait}`` of the class's settable traits defined in this package, in class order."""
    out = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith(PACKAGE):
            continue
        for name, trait in vars(klass).items():
            if getattr(trait, "metadata", {}).get("config") and hasattr(trait, "default_value_repr"):
                out[name] = cls.class_traits()[name]
    return out


def rst_lines(cls, shown_as):
    lines = []
    for name, trait in own_config_traits(cls).items():
        help_text = " ".join((trait.help or "").split()) or "(no help)"
        lines += [
            f".. describe:: {shown_as}.{name}",
            "",
            f"   {help_text}",
            "",
            f"   :type: ``{type(trait).__name__}``",
            f"   :default: ``{trait.default_value_repr()}``",
            "",
        ]
    return lines


class TraitletsConfig(SphinxDirective):
    required_arguments = 1
    optional_arguments = 2  # "as Name"

    def run(self):
        cls = _class(self.arguments[0])
        shown_as = self.arguments[2] if len(self.arguments) == 3 and self.arguments[1] == "as" else cls.__name__
        lines = rst_lines(cls, shown_as)
        if not lines:
            raise self.error(f"{self.arguments[0]} has no settings of {PACKAGE}'s own")
        # reStructuredText, whichever parser (MyST or RST) reads the page around it
        doc = new_document(f"<traitlets-config {cls.__name__}>", self.state.document.settings)
        Parser().parse("\n".join(lines), doc)
        return doc.children


def setup(app):
    app.add_directive("traitlets-config", TraitletsConfig)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
