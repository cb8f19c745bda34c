"""Storage formats: one module per format, each registering its class with
``@register`` (registry.py).  Importing this package imports every module in it, so a
new format needs no edit here."""

import importlib
import pkgutil

from .registry import get_format, register, registered

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

#: Every format, name -> class, in canonical order (their declared order).
FORMATS = registered()

__all__ = ["FORMATS", "get_format", "register", "registered"]
