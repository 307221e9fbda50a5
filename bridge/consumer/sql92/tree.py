"""The syntax tree of an SQL92 filter expression, as the parser builds it: one node class per
construct of RocketMQ's grammar, with where its text starts (for errors), and the bounds on
nesting that keep parsing, compiling and evaluating within Python's stack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from bridge.consumer.sql92.values import Value


@dataclass(frozen=True, slots=True)
class Node:
    position: int
    """Where the node's text starts in the expression (for errors)."""
    text: str
    """The token that makes it (for errors)."""


@dataclass(frozen=True, slots=True)
class Constant(Node):
    value: Value
    boolean: bool = False
    """TRUE, FALSE or NULL: RocketMQ's ``BooleanConstantExpression``, a boolean expression."""


@dataclass(frozen=True, slots=True)
class Property(Node):
    name: str


@dataclass(frozen=True, slots=True)
class Negate(Node):
    operand: Node


@dataclass(frozen=True, slots=True)
class Not(Node):
    operand: Node


@dataclass(frozen=True, slots=True)
class BooleanCast(Node):
    """A property where a boolean is expected: FALSE when present (its value is text)."""

    operand: Property


@dataclass(frozen=True, slots=True)
class Logic(Node):
    """AND or OR of two or more conditions: a chain ``a OR b OR c`` is one node, evaluated
    left to right as RocketMQ's left-nested pairs are, so that a long list of alternatives
    nests no deeper than two."""

    is_and: bool
    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Equal(Node):
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Order(Node):
    operator: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Between(Node):
    """``value [NOT] BETWEEN low AND high``: RocketMQ's ``(value >= low) AND (value <= high)``,
    or ``(value < low) OR (value > high)``, with ``value`` evaluated once rather than once per
    comparison (it is the same text, and evaluating it again gives the same result): shared,
    a value holding another BETWEEN would double the work at each level."""

    value: Node
    low: Node
    high: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class In(Node):
    operand: Property
    values: frozenset[str]
    negated: bool


@dataclass(frozen=True, slots=True)
class StringTest(Node):
    operator: str
    operand: Node
    search: str
    negated: bool


_BOOLEAN_NODES: Final = (Not, BooleanCast, Logic, Equal, Order, Between, In, StringTest)


def _children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Logic):
        return node.operands
    if isinstance(node, Equal | Order):
        return (node.left, node.right)
    if isinstance(node, Between):
        return (node.value, node.low, node.high)
    if isinstance(node, Negate | Not | BooleanCast | In | StringTest):
        return (node.operand,)
    return ()


MAX_NESTING: Final = 64
"""Parentheses, NOT and signs nested in one another, at most: the parser recurses once per
level (RocketMQ's, in Java, turns the stack overflow of a much deeper one into an invalid
expression; Python's stack is shorter, so the limit is explicit and an error names it)."""
MAX_DEPTH: Final = 128
"""Levels of the syntax tree, at most: building the filter and evaluating it recurse once per
level. Chains of AND and OR are one level each (:class:`Logic`); chains such as
``a IS NULL IS NULL ...`` or ``a = 1 = TRUE = ...`` add one level per operator."""


def too_deep(root: Node) -> Node | None:
    """The first node found deeper than :data:`MAX_DEPTH` in ``root``'s tree (walked
    without recursion), or None."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return node
        stack.extend((child, depth + 1) for child in _children(node))
    return None


def is_boolean(node: Node) -> bool:
    """RocketMQ's ``BooleanExpression``: what can stand where a condition is expected."""
    return isinstance(node, _BOOLEAN_NODES) or (isinstance(node, Constant) and node.boolean)
