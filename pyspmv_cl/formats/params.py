"""Declared format parameters: each format lists its :class:`Param` s, each with one of
the shared checks below, so every value is validated (type and range) before any
conversion or template rendering, with one message style.

A check is a callable ``value -> normalised value`` raising :class:`Invalid` with what
it expected; numpy integers and booleans are accepted as Python ones, integral floats
(``8.0``) and booleans are refused where an integer is expected.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import InvalidParameterError, UnknownParameterError


class Invalid(Exception):
    """Raised by a check: its text says what the parameter must be."""


Check = Callable[[Any], Any]


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def integer(low: int = None, high: int = None, *, power_of_two: bool = False) -> Check:
    """An integer in [low, high] (either bound optional), optionally a power of two."""
    what = "an integer"
    if power_of_two:
        what = "a power of two"
    if low is not None and high is not None:
        what += f" in [{low}, {high}]"
    elif low is not None:
        what += f" >= {low}"

    def check(value):
        if not _is_int(value):
            raise Invalid(what)
        value = int(value)
        if (low is not None and value < low) or (high is not None and value > high):
            raise Invalid(what)
        if power_of_two and (value < 1 or value & (value - 1)):
            raise Invalid(what)
        return value
    check.what = what
    return check


def positive_int() -> Check:
    return integer(1)


def one_of(*choices) -> Check:
    """One of ``choices`` (compared by value and type: ``True`` is not ``1``)."""
    what = f"one of {choices}"

    def check(value):
        for choice in choices:
            if type(choice) is str and value == choice:
                return choice
            if _is_int(choice) and _is_int(value) and int(value) == choice:
                return choice
        raise Invalid(what)
    check.what = what
    return check


def boolean() -> Check:
    def check(value):
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise Invalid("True or False")
    check.what = "True or False"
    return check


def number(*, greater_than: float = None) -> Check:
    what = "a number" + (f" > {greater_than:g}" if greater_than is not None else "")

    def check(value):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise Invalid(what)
        value = float(value)
        if greater_than is not None and not value > greater_than:
            raise Invalid(what)
        return value
    check.what = what
    return check


def limit(what: str = "a number >= 1, or inf (no limit)", integer: bool = False) -> Check:
    """A limit (ell's ``max_padding``, dia's ``max_fill`` and ``max_diagonals``): a number
    >= 1 (an integer where ``integer``), or inf for none.  Through ``SpMV`` None keeps the
    default, as for every parameter, so "no limit" is kept as inf, which ``op.params``
    gives back as it was given; a format built directly takes None as no limit too."""
    as_number = number()

    def check(value):
        if value is None:
            return math.inf
        try:
            value = as_number(value)
        except Invalid:
            raise Invalid(what) from None
        if value == math.inf:
            return math.inf
        if not value >= 1 or (integer and value != int(value)):
            raise Invalid(what)
        return int(value) if integer else value
    check.what = what
    return check


def or_words(check: Check, *words) -> Check:
    """``check``'s values, or one of the words (e.g. ``"auto"``; ``None`` allowed too:
    it means "choose for me" and is resolved later from the matrix)."""
    what = f"{check.what}" + "".join(
        f" or {w!r}" for w in words)

    def wrapped(value):
        if value in words and (value is None or isinstance(value, str)):
            return value
        try:
            return check(value)
        except Invalid:
            raise Invalid(what) from None
    wrapped.what = what
    return wrapped


def optional(check: Check) -> Check:
    """``check``'s values or None."""
    return or_words(check, None)


@dataclasses.dataclass(frozen=True)
class Param:
    """One declared parameter of a format."""

    name: str
    check: Check
    doc: str = ""

    def validate(self, format_name: str, value):
        try:
            return self.check(value)
        except Invalid as exc:
            raise InvalidParameterError(
                f"{format_name}: {self.name} must be {exc}, not {value!r}") from None


def work_group_size(doc: str = "work-items per work-group") -> Param:
    return Param("work_group_size", positive_int(), doc)


#: Every format takes ``index_bits`` (32, 64 or None: 32 while the sizes fit).
INDEX_BITS = Param("index_bits", or_words(one_of(32, 64), None, "auto"),
                   "index type width: 32, 64, or None/'auto' for 32 while the sizes fit")


def check_multiple(format_name: str, params: dict, what: str, factor: int,
                   name: str = "work_group_size", context: str = "") -> None:
    """``params[name]`` must be a positive multiple of ``factor`` (``what`` names it,
    e.g. "omega"); rules between parameters, in ``check_params``."""
    value = params[name]
    if value is not None and factor and (value < factor or value % factor):
        raise InvalidParameterError(
            f"{format_name}: {context}{name} must be a multiple of {what} ({factor}), "
            f"not {value!r}")


def resolve(format_name: str, declared: Iterable[Param], defaults: dict,
            given: dict) -> dict:
    """Defaults overridden by the caller's values (None keeps the default), each
    validated by its declaration; an undeclared name is refused."""
    declared = {p.name: p for p in (*declared, INDEX_BITS)}
    unknown = set(given) - set(declared)
    if unknown:
        raise UnknownParameterError(
            f"format {format_name!r} takes no parameter(s) {', '.join(sorted(unknown))}; it "
            f"accepts: {', '.join(sorted(declared))}")
    params = dict(defaults)
    params.update({k: v for k, v in given.items() if v is not None})
    for name, value in params.items():
        if name in declared:
            params[name] = declared[name].validate(format_name, value)
    return params
