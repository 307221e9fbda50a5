"""The public names of ``bridge``, imported when first used (PEP 562): each documented name
is there, ``from bridge import *`` and ``dir(bridge)`` give them and nothing of the module's
own, and ``import bridge`` alone loads none of the clients."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import bridge


def test_every_public_name_is_its_module_s_object() -> None:
    assert set(bridge._EXPORTS) == set(bridge.__all__) - {"__version__"}
    for name, module in bridge._EXPORTS.items():
        assert getattr(bridge, name) is getattr(importlib.import_module(module), name)


def test_a_star_import_gives_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from bridge import *", namespace)
    assert set(bridge.__all__) <= set(namespace)


def test_dir_lists_the_public_names_and_none_of_the_module_s_own_imports() -> None:
    listed = set(dir(bridge))
    assert set(bridge.__all__) <= listed
    assert not {"annotations", "importlib", "TYPE_CHECKING", "Any"} & listed


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'bridge' has no attribute 'Nothing'"):
        _ = bridge.Nothing
    assert not hasattr(bridge, "Nothing")


def test_importing_bridge_loads_no_client() -> None:
    code = (
        "import sys, bridge, bridge.errors; "
        "print(sorted(m for m in ('bridge.client', 'bridge.consumer', 'bridge.transaction', "
        "'bridge.aio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
