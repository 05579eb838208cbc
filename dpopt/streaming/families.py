"""FAMILIES: every streaming family's `optimise`, by name, each module imported on first use.

Every family has the one signature
    optimise(A, participation, *, objective="mean", time_limit=None, callback=None, **family_options)
        -> dpopt.streaming.base.Factorization
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterator, Mapping
from typing import Any

#: family name -> module holding its `optimise`.
FAMILY_MODULES = {
    "optimal": "dpopt.streaming.optimal",
    "sqrt": "dpopt.streaming.sqrt",
    "toeplitz": "dpopt.streaming.toeplitz",
    "banded": "dpopt.streaming.banded",
    "blt": "dpopt.streaming.blt",
}


class FamilyUnavailableError(ValueError):
    """A family whose module is not part of this build."""


class _Families(Mapping[str, Callable[..., Any]]):
    """A read-only mapping name -> optimise that imports the family's module on first access."""

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if name not in FAMILY_MODULES:
            raise KeyError(name)
        module = FAMILY_MODULES[name]
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            raise FamilyUnavailableError(f"family {name!r} is not available in this build ({module} is missing)") \
                from None
        return mod.optimise

    def __iter__(self) -> Iterator[str]:
        return iter(FAMILY_MODULES)

    def __len__(self) -> int:
        return len(FAMILY_MODULES)

    def available(self, name: str) -> bool:
        """True when the family's module can be imported."""
        return importlib.util.find_spec(FAMILY_MODULES[name]) is not None


FAMILIES = _Families()
