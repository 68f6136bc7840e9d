"""Symbolic sizes: the ``SymInt`` values of graphs compiled with dynamic shapes.

A graph compiled with ``dynamic=True``, ``mark_dynamic`` or Dynamo's automatic dynamic shapes (the
recompile after a size changed) holds sizes and strides as ``torch.SymInt``: an expression of
``ShapeEnv`` symbols (``s27``, ``2*s27``, ``64*s27``) over the sizes of the graph's inputs. The
dump describes each slot by those expressions at compile time and evaluates them on the host at run
time, from the symbols' values the graph hands over (``torchdebug.graph_dump._plan``).

What is read, and why here:

- ``SymInt.node.expr``: the sympy expression of a symbolic value (``SymNode.expr`` applies the
  shape environment's replacements, so equal sizes share one symbol);
- ``SymInt.node.hint``: the example value the graph was traced with (``None`` for data-dependent,
  "unbacked", sizes): only for choices made at compile time, never written into a record
  (``symbolic_shapes.hint_int`` of earlier releases is gone in 2.13, the attribute is not).

Evaluation is plain sympy (a dependency of torch): the expressions are polynomials of the symbols,
or torch's own sympy functions (``FloorDiv``, ``Mod``, ``Max``), which evaluate themselves once their
arguments are numbers. Unchanged from torch 2.11 through 2.14.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from torchdebug._torch import require

require("graph dumps with dynamic shapes (symbolic sizes)")

import sympy  # noqa: E402
import torch  # noqa: E402

__all__ = ["SYMBOLIC_TYPES", "evaluate", "expression", "hint", "is_symbolic"]

SYMBOLIC_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic(value: Any) -> bool:
    """Whether ``value`` is a ``SymInt``/``SymFloat``/``SymBool`` whose value is not a constant."""
    return isinstance(value, SYMBOLIC_TYPES) and not expression(value).is_number


def expression(value: Any) -> sympy.Expr:
    """The sympy expression of a symbolic value (a sympy number for a plain one)."""
    if isinstance(value, SYMBOLIC_TYPES):
        return value.node.expr
    return sympy.sympify(value)


def hint(value: Any, fallback: int) -> int:
    """The value a symbolic int had when the graph was traced (``fallback`` when it has none: a
    data-dependent size); a plain int as it is."""
    if not isinstance(value, SYMBOLIC_TYPES):
        return int(value)
    example = getattr(value.node, "hint", None)
    return int(example) if isinstance(example, (int, bool)) else fallback


def evaluate(expressions: Iterable[sympy.Expr], values: Mapping[sympy.Symbol, int]) -> list[Any]:
    """Each expression with the symbols' values put in: an ``int`` (a ``float`` or ``bool`` for
    ``SymFloat``/``SymBool`` expressions); the expression as a string where a symbol it needs has no
    value (a size the graph could not hand over)."""
    numbers = {symbol: sympy.Integer(value) for symbol, value in values.items()}
    return [_number(expr.xreplace(numbers), expr) for expr in expressions]


def _number(result: sympy.Basic, expr: sympy.Expr) -> Any:
    if result is sympy.true or result is sympy.false:
        return bool(result)
    if getattr(result, "is_number", False):
        if result.is_Integer:
            return int(result)
        value = complex(result.evalf())
        return float(value.real) if not value.imag else str(expr)
    return str(expr)
