"""Entry points of a package loaded on first use: each sub-package's `__init__` names its public functions and
classes without importing the modules that define them, so importing one module of a package (a command's
start-up reads `models.arch.archfile`) does not load the rest of it (PEP 562 module `__getattr__`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def entry_points(package: str, where: Mapping[str, str]) -> tuple[Callable, Callable, list[str]]:
    """(`__getattr__`, `__dir__`, `__all__`) for `package`, whose public names are the keys of `where` and are
    defined in the modules its values name."""

    def __getattr__(name: str):
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(where))

    return __getattr__, __dir__, sorted(where)
