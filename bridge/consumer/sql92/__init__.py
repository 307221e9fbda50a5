"""RocketMQ's SQL92 property filter, as its broker evaluates it: parse an expression once
(:func:`compile_sql92`), then match messages' properties with the result (no I/O).

The grammar, the checks made while parsing and the evaluation rules are those of Apache
RocketMQ's ``filter`` module (``SelectorParser.jj``, ``ComparisonExpression``,
``LogicExpression``, ``UnaryExpression``, ``ConstantExpression``). Values carry Java's types,
because RocketMQ's results depend on them:

========  ==========================================================================
Java      here
========  ==========================================================================
Integer   ``int`` (a literal that fits in 32 bits; negation wraps as Java's does)
Long      ``values.Long``, an ``int`` subclass (a larger literal, or one with ``L``)
Double    ``float`` (a literal with ``.`` or an exponent; ordering as ``Double.compareTo``)
String    ``str`` (a string literal, or any property: every property value is text)
Boolean   ``bool``
null      ``None`` (a missing property, ``NULL``, or an unknown result)
========  ==========================================================================

A message matches when the expression evaluates to TRUE; null, FALSE or an error while
evaluating (a property that is not a number compared with one, say) mean no match, as
RocketMQ's broker decides. One difference, deliberate: text after a complete expression is
refused (:class:`~bridge.errors.FilterExpressionError`) where RocketMQ ignores it, so that
``a = 1 b = 2`` is not silently ``a = 1``.
"""

from __future__ import annotations

from bridge.consumer.sql92.evaluator import compile_tree
from bridge.consumer.sql92.parser import Parser
from bridge.consumer.sql92.values import Eval, EvaluationError, PropertyLookup
from bridge.errors import FilterExpressionError

__all__ = ["PropertyLookup", "SqlFilter", "compile_sql92"]


class SqlFilter:
    """A compiled SQL92 filter: :meth:`matches` tells whether a message's properties pass.

    Build it with :func:`compile_sql92`; it holds no state between calls, so one filter serves
    every thread."""

    __slots__ = ("_evaluate", "expression")

    def __init__(self, expression: str, evaluate: Eval) -> None:
        self.expression = expression
        self._evaluate = evaluate

    def matches(self, props: PropertyLookup) -> bool:
        """True if the expression is TRUE for the properties ``props`` looks up; False when it
        is FALSE, null (unknown: a property it needs is missing), or cannot be evaluated (a
        property that is not a number compared with a number), as RocketMQ's broker decides."""
        try:
            return self._evaluate(props) is True
        except EvaluationError:
            return False

    def evaluate(self, props: PropertyLookup) -> bool | None:
        """The expression's value: TRUE, FALSE or None (null, or an evaluation error)."""
        try:
            value = self._evaluate(props)
        except EvaluationError:
            return None
        return value if type(value) is bool else None

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"


def compile_sql92(expression: str) -> SqlFilter:
    """Parse ``expression`` with RocketMQ's SQL92 grammar and rules.

    Raises :class:`~bridge.errors.FilterExpressionError` (an ``InvalidArgumentError``) naming
    the offset, the text there and what was expected, where RocketMQ's parser refuses the
    expression, and also for text after a complete expression (which RocketMQ ignores)."""
    if not isinstance(expression, str):
        raise FilterExpressionError(str(expression), 0, "", "an SQL92 expression as a string")
    for index, char in enumerate(expression):
        if "\ud800" <= char <= "\udfff":
            raise FilterExpressionError(
                expression, index, char, "valid Unicode text (a lone surrogate cannot travel)"
            )
    return SqlFilter(expression, compile_tree(Parser(expression).parse()))
