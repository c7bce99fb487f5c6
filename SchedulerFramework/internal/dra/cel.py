"""CEL device selectors (DeviceClass and claim request `selectors[].cel.expression`),
evaluated with a maintained CEL implementation (the `cel` module of
common-expression-language) as kube-scheduler evaluates them
(k8s.io/dynamic-resource-allocation/cel).

The expression sees one variable, `device`: `driver`, `allowMultipleAllocations`,
`attributes[domain][name]` and `capacity[domain][name]` (unqualified names are in the
driver's domain). Kubernetes' quantity library is served for capacities, which are integers
here: `quantity("10Gi")`, `q.compareTo(q2)`, `q.isGreaterThan(q2)`, `q.isLessThan(q2)`,
`q.asInteger()`, `q.asApproximateFloat()`, `isQuantity(s)`. Not served: `semver()` values.
A selector that does not compile, names another variable or returns something else than a
bool is a SelectorError; one that fails at run time (an attribute the device lacks, without
`has()` around it) does not match the device, as a runtime error fails the selector upstream.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import cel

from lj_runtimekit.proto.pkg.quantity import QuantityError, parse_quantity

_Number = int | float


class SelectorError(ValueError):
    """A CEL selector that cannot be used; the message names the expression."""


def _quantity(text: str) -> _Number:
    try:
        value = parse_quantity(text)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    return int(value) if value == value.to_integral_value() else float(value)


def _is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def _compare(a: _Number, b: _Number) -> int:
    return (a > b) - (a < b)


_FUNCTIONS: Mapping[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: a > b,
    "isLessThan": lambda a, b: a < b,
    "asInteger": int,
    "asApproximateFloat": float,
}


class Selector:
    """One compiled selector."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        try:
            self._program = cel.compile(expression)
        except (ValueError, RuntimeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SelectorError(f"CEL selector {expression!r} does not compile: {first}") from None
        unknown = set(self._program.variables()) - {"device"}
        if unknown:
            raise SelectorError(
                f"CEL selector {expression!r} uses {', '.join(sorted(unknown))}: "
                "only the variable device is defined"
            )

    def matches(self, device: Mapping[str, Any]) -> tuple[bool, str]:
        """Whether the device (its CEL view) matches, and the runtime error when it failed."""
        context = cel.Context({"device": device})
        for name, fn in _FUNCTIONS.items():
            context.add_function(name, fn)
        try:
            result = self._program.execute(context)
        except (ValueError, TypeError, RuntimeError, KeyError) as exc:
            return False, f"CEL selector {self.expression!r}: {exc}"
        if not isinstance(result, bool):
            return False, f"CEL selector {self.expression!r} returned {result!r}, not a bool"
        return result, ""


MAX_COMPILED = 4096
"""Selectors kept compiled; past that the memo starts again (claims may each have their own)."""


class Selectors:
    """Compiled selectors by expression (shared by every claim and class using one)."""

    def __init__(self) -> None:
        self._compiled: dict[str, Selector | SelectorError] = {}
        self._lock = threading.Lock()

    def get(self, expression: str) -> Selector:
        """The compiled selector; a SelectorError (remembered) when it cannot be used."""
        with self._lock:
            found = self._compiled.get(expression)
            if found is None:
                try:
                    found = Selector(expression)
                except SelectorError as exc:
                    found = exc
                if len(self._compiled) >= MAX_COMPILED:
                    self._compiled.clear()
                self._compiled[expression] = found
        if isinstance(found, SelectorError):
            raise found
        return found


def cel_quantity(value: Decimal) -> _Number:
    """A capacity as the selectors see it."""
    return int(value) if value == value.to_integral_value() else float(value)
