"""Lazy package exports: a name is imported from its module when first asked for, and every
name a package exports that way resolves to its module's object."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from astra_agent.lazy import lazy_exports


def test_a_name_comes_from_its_module_and_an_unknown_one_is_an_attribute_error() -> None:
    getattr_ = lazy_exports("pkg", {"dumps": "json"})
    assert getattr_("dumps") is json.dumps
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'loads'"):
        getattr_("loads")


@pytest.mark.parametrize("package", ["serving", "training.rl"])
def test_every_export_resolves_to_its_modules_object(package: str) -> None:
    pkg = importlib.import_module(package)
    for name in pkg.__all__:
        module = importlib.import_module(pkg._EXPORTS[name])
        assert getattr(pkg, name) is getattr(module, name)
    with pytest.raises(AttributeError, match=f"module {package!r} has no attribute 'nope'"):
        pkg.nope  # noqa: B018


def test_the_package_loads_its_modules_only_when_asked() -> None:
    code = (
        "import sys, serving; before = 'serving.convert' in sys.modules; serving.ConvertResult; "
        "print(before, 'serving.convert' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False", "True"]
