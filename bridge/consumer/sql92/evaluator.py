"""Evaluation of an SQL92 syntax tree as RocketMQ's broker evaluates it
(``ComparisonExpression``, ``LogicExpression``, ``UnaryExpression``): the tree is compiled once
into nested functions of a message's properties, so matching a message walks no tree and
parses nothing. Three-valued: TRUE, FALSE and null (``None``, unknown)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from bridge.consumer.sql92.tree import (
    Between,
    BooleanCast,
    Constant,
    Equal,
    In,
    Logic,
    Negate,
    Node,
    Not,
    Order,
    Property,
    StringTest,
)
from bridge.consumer.sql92.values import (
    Eval,
    PropertyLookup,
    Value,
    compare,
    compare_doubles,
    java_double,
    negate,
)


def compile_tree(node: Node) -> Eval:  # noqa: PLR0911 - one case per node type
    """``node`` as a function of a message's properties, built once: evaluation walks no tree
    and parses nothing."""
    if isinstance(node, Constant):
        value = node.value
        return lambda _props: value
    if isinstance(node, Property):
        return _property(node.name)
    if isinstance(node, Negate):
        operand = compile_tree(node.operand)
        return lambda props: negate(operand(props))
    if isinstance(node, Not):
        return _not(compile_tree(node.operand))
    if isinstance(node, BooleanCast):
        read = _property(node.operand.name)
        return lambda props: None if read(props) is None else False
    if isinstance(node, Logic):
        return _logic(tuple(map(compile_tree, node.operands)), decisive=not node.is_and)
    if isinstance(node, Equal):
        return _equal(compile_tree(node.left), compile_tree(node.right))
    if isinstance(node, Order):
        return _order(node.operator, compile_tree(node.left), compile_tree(node.right))
    if isinstance(node, Between):
        return _between(
            compile_tree(node.value), compile_tree(node.low), compile_tree(node.high), node.negated
        )
    if isinstance(node, In):
        return _in(_property(node.operand.name), node.values, node.negated)
    if isinstance(node, StringTest):
        return _string_test(node.operator, compile_tree(node.operand), node.search, node.negated)
    raise AssertionError(f"unknown node {node!r}")  # pragma: no cover


def _property(name: str) -> Eval:
    def read(props: PropertyLookup) -> Value:
        value = props(name)
        if isinstance(value, bytes):  # as RocketMQ's broker decodes properties: U+FFFD
            return value.decode("utf-8", "replace")
        return value

    return read


def _not(operand: Eval) -> Eval:
    def evaluate(props: PropertyLookup) -> Value:
        value = operand(props)
        return None if value is None else not value

    return evaluate


def _logic(operands: tuple[Eval, ...], decisive: bool) -> Eval:
    """AND (``decisive`` FALSE) or OR (TRUE) of ``operands``, as RocketMQ's left-nested pairs
    ``((a OR b) OR c)`` evaluate: the decisive value decides at once (what follows is not
    evaluated); else null if an operand so far is null."""
    first, rest = operands[0], operands[1:]

    def evaluate(props: PropertyLookup) -> Value:
        value = first(props)
        for operand in rest:
            if value is decisive:
                return decisive
            current = operand(props)
            if current is decisive:
                return decisive
            value = None if value is None or current is None else not decisive
        return value

    return evaluate


def _equal(left: Eval, right: Eval) -> Eval:
    def evaluate(props: PropertyLookup) -> Value:
        lv = left(props)
        rv = right(props)
        if lv is None:
            return True if rv is None else None
        if rv is None:
            return False
        return compare(lv, rv) == 0  # Double's order: NaN = NaN is TRUE, 0.0 = -0.0 FALSE

    return evaluate


_ORDERINGS: Final[dict[str, Callable[[int], bool]]] = {
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
}


def _order(operator: str, left: Eval, right: Eval) -> Eval:
    holds = _ORDERINGS[operator]

    def evaluate(props: PropertyLookup) -> Value:
        lv = left(props)
        if lv is None:
            return None
        rv = right(props)
        if rv is None:
            return None
        return _ordered(holds, lv, rv)

    return evaluate


def _ordered(holds: Callable[[int], bool], lv: Value, rv: Value) -> bool:
    """An ordering of two values, neither null."""
    if type(lv) is str and type(rv) is str:  # two properties: compared as numbers
        return holds(compare_doubles(java_double(lv), java_double(rv)))
    return holds(compare(lv, rv))


def _between(value: Eval, low: Eval, high: Eval, negated: bool) -> Eval:
    """``(value >= low) AND (value <= high)``, or ``(value < low) OR (value > high)``, as
    RocketMQ evaluates those: the second comparison only when the first does not decide, and
    null when either is null and none decides. ``value`` is evaluated once: RocketMQ evaluates
    it for each comparison, with the same result."""
    first = _ORDERINGS["<" if negated else ">="]
    second = _ORDERINGS[">" if negated else "<="]
    decisive = negated  # OR stops at TRUE, AND at FALSE

    def evaluate(props: PropertyLookup) -> Value:
        v = value(props)
        if v is None:
            return None  # both comparisons are null
        bound = low(props)
        lower = None if bound is None else _ordered(first, v, bound)
        if lower is decisive:
            return decisive
        bound = high(props)
        upper = None if bound is None else _ordered(second, v, bound)
        if upper is decisive:
            return decisive
        return None if lower is None or upper is None else not decisive

    return evaluate


def _in(read: Eval, values: frozenset[str], negated: bool) -> Eval:
    def evaluate(props: PropertyLookup) -> Value:
        value = read(props)
        if type(value) is not str:
            return None
        return (value in values) is not negated

    return evaluate


_STRING_TESTS: Final[dict[str, Callable[[str, str], bool]]] = {
    "CONTAINS": lambda value, search: search in value,
    "STARTSWITH": str.startswith,
    "ENDSWITH": str.endswith,
}


def _string_test(operator: str, operand: Eval, search: str, negated: bool) -> Eval:
    test = _STRING_TESTS[operator]

    def evaluate(props: PropertyLookup) -> Value:
        if not search:
            return False
        value = operand(props)
        if type(value) is not str:
            return False
        return test(value, search) is not negated

    return evaluate
