"""Every docstring example in the library runs (the rewards' TRL-style examples among them)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import pipelines

MODULES = sorted(m.name for m in pkgutil.walk_packages(pipelines.__path__, "pipelines."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_examples_exist():
    examples = sum(doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS).attempted for name in MODULES)
    assert examples >= 90
