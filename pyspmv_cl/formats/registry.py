"""The registry of storage formats: a format module registers its class with
``@register``; ``pyspmv_cl.formats`` imports every module of the package, so adding a
format is adding its module (and its template and tests)."""

from __future__ import annotations

from ..errors import InvalidParameterError

_registered: dict = {}


def register(cls):
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name or cls.name == "auto":
        raise ValueError(f"{cls.__name__}: a format needs a name other than 'auto'")
    other = _registered.get(cls.name)
    if other is not None and other is not cls:
        raise ValueError(f"format name {cls.name!r} registered twice ({other.__module__}, "
                         f"{cls.__module__})")
    _registered[cls.name] = cls
    return cls


def registered() -> dict:
    """Every registered format, name -> class, in their declared ``order``."""
    return dict(sorted(_registered.items(), key=lambda item: (item[1].order, item[0])))


def get_format(name: str):
    try:
        return _registered[name]
    except KeyError:
        raise InvalidParameterError(
            f"unknown format {name!r}; available: {', '.join(registered())} or 'auto'"
        ) from None
