"""The configuration reference is committed as Markdown, readable on a forge;
it must be what ``tools/configref.py`` makes from the traitlets classes now."""

import os

import pytest

from ipyparallel_broadcast.tools import configref

pytestmark = pytest.mark.pure

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "config.md")


def test_the_committed_configuration_reference_is_up_to_date():
    with open(PAGE) as f:
        committed = f.read()
    assert committed == configref.render(), (
        "docs/config.md is stale: python -m ipyparallel_broadcast.tools.configref docs/config.md"
    )


def test_every_section_lists_settings_with_type_default_and_help():
    page = configref.render()
    for heading, _, classes in configref.SECTIONS:
        assert f"## {heading}" in page
        for path in classes:
            for item in configref.entries(configref._class(path)):
                assert item.startswith("- **`") and "default `" in item and "(no help)" not in item, item
