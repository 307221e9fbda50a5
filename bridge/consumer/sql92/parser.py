"""The lexer and parser of RocketMQ's SQL92 grammar (``SelectorParser.jj``): an expression
becomes a syntax tree (:mod:`bridge.consumer.sql92.tree`), or a
:class:`~bridge.errors.FilterExpressionError` naming the offset, the text there and what was
expected where RocketMQ's parser refuses it."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Final, NamedTuple

from bridge.consumer.sql92.tree import (
    MAX_DEPTH,
    MAX_NESTING,
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
    is_boolean,
    too_deep,
)
from bridge.consumer.sql92.values import INT32, INT64, EvaluationError, Long, compare
from bridge.errors import FilterExpressionError

# --- the lexer -----------------------------------------------------------------------------

_KEYWORDS: Final = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"}
    | {"CONTAINS", "STARTSWITH", "ENDSWITH"}
)


class _Kind:
    ID = "a property name"
    KEYWORD = "a keyword"
    DECIMAL = "an integer"
    FLOAT = "a number"
    STRING = "a string"
    PUNCT = "punctuation"
    END = "the end"


class _Token(NamedTuple):
    kind: str
    text: str
    """As written (keywords upper-cased)."""
    position: int


_SKIPPED: Final = re.compile(r"(?:[ \t\n\r\f]+|--[^\n\r]*(?:\r\n|\n|\r|$)|/\*.*?\*/)+", re.DOTALL)
"""Whitespace and comments. A line comment ends at a line break, or (unlike RocketMQ, which
then reads ``--`` as two minus signs) at the end of the expression."""
_TOKEN: Final = re.compile(
    r"(?P<float>[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
    r"|[0-9]+[eE][+-]?[0-9]+)"
    r"|(?P<decimal>0|[1-9][0-9]*[lL]?)"
    r"|(?P<id>[A-Za-z_$][A-Za-z0-9_$]*)"
    r"|(?P<string>'(?:''|[^'])*')"
    r"|(?P<punct><>|<=|>=|[=<>(),+-])"
)
"""RocketMQ's tokens, longest first where one is a prefix of another (``5.5`` before ``5``,
``<>`` before ``<``)."""


def _tokens(expression: str) -> list[_Token]:
    out: list[_Token] = []
    position, end = 0, len(expression)
    while True:
        skipped = _SKIPPED.match(expression, position)
        if skipped is not None:
            position = skipped.end()
        if position >= end:
            out.append(_Token(_Kind.END, "", end))
            return out
        match = _TOKEN.match(expression, position)
        if match is None:
            found = expression[position]
            if expression.startswith("/*", position):
                found, expected = expression[position:][:20], "a comment that ends with */"
            elif found == "'":
                found, expected = expression[position:][:20], "a string that ends with '"
            else:
                expected = "a property, a constant, an operator or a parenthesis"
            raise FilterExpressionError(expression, position, found, expected)
        kind = match.lastgroup
        text = match.group()
        if kind == "id" and text.upper() in _KEYWORDS:
            out.append(_Token(_Kind.KEYWORD, text.upper(), position))
        else:
            out.append(_Token(_TOKEN_KINDS[kind or ""], text, position))
        position = match.end()


_TOKEN_KINDS: Final = {
    "float": _Kind.FLOAT,
    "decimal": _Kind.DECIMAL,
    "id": _Kind.ID,
    "string": _Kind.STRING,
    "punct": _Kind.PUNCT,
}

_DOUBLE_MIN: Final = 5e-324
"""Java's ``Double.MIN_VALUE``: RocketMQ refuses a float literal below it, zero included."""


# --- the parser ----------------------------------------------------------------------------


class Parser:
    """Recursive descent over RocketMQ's grammar (``SelectorParser.jj``), lowest precedence
    first: OR, AND, equality (``=``, ``<>``, ``IS [NOT] NULL``), comparison (``<`` ... ``IN``,
    ``BETWEEN``, ``CONTAINS`` ...), unary (``+``, ``-``, ``NOT``), primary."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.tokens = _tokens(expression)
        self.index = 0
        self.nesting = 0
        """How many :meth:`unary` calls are open (each nesting level opens one)."""

    # --- helpers
    @property
    def token(self) -> _Token:
        return self.tokens[self.index]

    def _peek(self, ahead: int = 1) -> _Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def _is(self, text: str, token: _Token | None = None) -> bool:
        token = token or self.token
        return token.kind in (_Kind.KEYWORD, _Kind.PUNCT) and token.text == text

    def _advance(self) -> _Token:
        token = self.token
        self.index += 1
        return token

    def _expect(self, text: str, expected: str) -> _Token:
        if not self._is(text):
            raise self.error(expected)
        return self._advance()

    def error(self, expected: str, token: _Token | None = None) -> FilterExpressionError:
        token = token or self.token
        return self._error(token.position, token.text, expected)

    def refuse(self, node: Node, expected: str) -> FilterExpressionError:
        return self._error(node.position, node.text, expected)

    def _error(self, position: int, text: str, expected: str) -> FilterExpressionError:
        # The text as written: a keyword's token is upper-cased (``and`` is ``AND``).
        found = self.expression[position : position + len(text)]
        return FilterExpressionError(self.expression, position, found, expected)

    def condition(self, node: Node) -> Node:
        """RocketMQ's ``asBooleanExpression``: a property is read as a boolean; anything else
        must be a condition."""
        if is_boolean(node):
            return node
        if isinstance(node, Property):
            return BooleanCast(node.position, node.text, node)
        raise self.refuse(node, "a condition (this does not result in a boolean value)")

    # --- grammar
    def parse(self) -> Node:
        node = self.condition(self.disjunction())
        if self.token.kind != _Kind.END:
            raise self.error(
                "the end of the expression, AND, OR or a comparison (RocketMQ would ignore "
                "the rest; refused so that it cannot change the meaning unseen)"
            )
        deepest = too_deep(node)
        if deepest is not None:
            raise self.refuse(deepest, f"an expression nested at most {MAX_DEPTH} operators deep")
        return node

    def disjunction(self) -> Node:
        return self._chain("OR", self.conjunction)

    def conjunction(self) -> Node:
        return self._chain("AND", self.equality)

    def _chain(self, keyword: str, operand: Callable[[], Node]) -> Node:
        """``operand (keyword operand)*`` as one :class:`Logic`; each side is checked to be a
        condition once the operand after it is read, in the order RocketMQ's parser checks."""
        left = operand()
        if not self._is(keyword):
            return left
        op = self.token
        operands: list[Node] = []
        while self._is(keyword):
            self._advance()
            right = operand()
            if not operands:
                operands.append(self.condition(left))
            operands.append(self.condition(right))
        return Logic(op.position, op.text, keyword == "AND", tuple(operands))

    def equality(self) -> Node:
        left = self.comparison()
        while True:
            token = self.token
            if self._is("=") or self._is("<>"):
                self._advance()
                right = self.comparison()
                self._check_equal_operands(left, right)
                left = Equal(token.position, token.text, left, right)
                if token.text == "<>":
                    left = Not(token.position, token.text, left)
            elif self._is("IS"):
                self._advance()
                negated = self._is("NOT")
                if negated:
                    self._advance()
                self._expect("NULL", "NULL or NOT NULL after IS")
                null = Constant(token.position, token.text, None, boolean=True)
                left = Equal(token.position, token.text, left, null)
                if negated:
                    left = Not(token.position, token.text, left)
            else:
                return left

    def _check_equal_operands(self, left: Node, right: Node) -> None:
        for side in (left, right):
            if isinstance(side, Constant) and side.value is None:
                raise self.refuse(side, "a value to compare with (use IS NULL to test for null)")
        if (
            isinstance(left, Constant)
            and isinstance(right, Constant)
            and left.boolean
            and not right.boolean
        ):
            raise self.refuse(right, f"TRUE or FALSE to compare {left.text} with")

    def _check_ordered(self, node: Node, op: str) -> Node:
        """RocketMQ's ``checkLessThanOperand``: a number constant, a property or a negation."""
        if isinstance(node, Constant):
            if node.boolean or type(node.value) is str:
                raise self.refuse(node, f"a number or a property to compare with {op}")
        elif is_boolean(node):
            raise self.refuse(node, f"a number or a property to compare with {op}, not a condition")
        return node

    def comparison(self) -> Node:
        left = self.unary()
        while True:
            token = self.token
            negated = self._is("NOT")
            op = self._peek() if negated else token
            if not negated and token.kind == _Kind.PUNCT and token.text in ("<", "<=", ">", ">="):
                self._advance()
                right = self.unary()
                left = Order(
                    token.position,
                    token.text,
                    token.text,
                    self._check_ordered(left, token.text),
                    self._check_ordered(right, token.text),
                )
            elif op.kind == _Kind.KEYWORD and op.text in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
                self.index += 2 if negated else 1
                search = self._string(f"a string after {op.text}")
                left = StringTest(token.position, token.text, op.text, left, search, negated)
            elif self._is("BETWEEN", op):
                self.index += 2 if negated else 1
                low = self.unary()
                self._expect("AND", "AND between the bounds of BETWEEN")
                high = self.unary()
                left = self._between(token, left, low, high, negated)
            elif self._is("IN", op):
                self.index += 2 if negated else 1
                if not isinstance(left, Property):
                    raise self.refuse(left, "a property before IN")
                self._expect("(", "( after IN")
                values = [self._string("a string in the IN list")]
                while self._is(","):
                    self._advance()
                    values.append(self._string("a string in the IN list"))
                self._expect(")", ", or ) in the IN list")
                left = In(token.position, token.text, left, frozenset(values), negated)
            elif negated:
                raise self.error("CONTAINS, STARTSWITH, ENDSWITH, BETWEEN or IN after NOT", op)
            else:
                return left

    def _between(self, token: _Token, value: Node, low: Node, high: Node, negated: bool) -> Node:
        if negated:  # (value < low) OR (value > high), with no check of the bounds
            what = "NOT BETWEEN"
            self._check_ordered(value, what)
            self._check_ordered(low, what)
            self._check_ordered(high, what)
            return Between(token.position, token.text, value, low, high, negated)
        if isinstance(low, Constant) and isinstance(high, Constant):
            if low.value is None or high.value is None:
                raise self.refuse(low if low.value is None else high, "BETWEEN bounds, not NULL")
            try:
                reversed_bounds = compare(high.value, low.value) < 0
            except EvaluationError:
                reversed_bounds = True
            if reversed_bounds:
                raise self.refuse(
                    high, f"an upper bound of BETWEEN comparable with {low.text} and not below it"
                )
        self._check_ordered(value, "BETWEEN")
        self._check_ordered(low, "BETWEEN")
        self._check_ordered(high, "BETWEEN")
        return Between(token.position, token.text, value, low, high, negated)

    def _string(self, expected: str) -> str:
        token = self.token
        if token.kind != _Kind.STRING:
            raise self.error(expected)
        self._advance()
        return token.text[1:-1].replace("''", "'")

    def unary(self) -> Node:
        if self.nesting >= MAX_NESTING:
            raise self.error(
                f"an expression nested at most {MAX_NESTING} deep in parentheses, NOT and signs"
            )
        self.nesting += 1
        try:
            return self._unary()
        finally:
            self.nesting -= 1

    def _unary(self) -> Node:
        token = self.token
        if self._is("+"):
            self._advance()
            return self.unary()
        if self._is("-"):
            self._advance()
            return Negate(token.position, token.text, self.unary())
        if self._is("NOT"):
            self._advance()
            return Not(token.position, token.text, self.condition(self.unary()))
        return self.primary()

    def primary(self) -> Node:
        token = self.token
        kind = token.kind
        if kind == _Kind.STRING:
            return Constant(token.position, token.text, self._string(""))
        if kind == _Kind.DECIMAL:
            self._advance()
            return Constant(token.position, token.text, self._decimal(token))
        if kind == _Kind.FLOAT:
            self._advance()
            return Constant(token.position, token.text, self._float(token))
        if kind == _Kind.ID:
            self._advance()
            return Property(token.position, token.text, token.text)
        if kind == _Kind.KEYWORD and token.text in ("TRUE", "FALSE", "NULL"):
            self._advance()
            value = {"TRUE": True, "FALSE": False, "NULL": None}[token.text]
            return Constant(token.position, token.text, value, boolean=True)
        if self._is("("):
            self._advance()
            node = self.disjunction()
            self._expect(")", "AND, OR, a comparison or )")
            return node
        raise self.error("a property, a constant, NOT, - or (")

    def _decimal(self, token: _Token) -> int:
        digits = token.text.rstrip("lL")
        # No leading zeros (the lexer reads "007" as three tokens), so the length says it all;
        # int() would refuse past 4,300 digits with a ValueError.
        value = int(digits) if len(digits) <= len(str(INT64)) else INT64
        if value >= INT64:
            raise self.error("an integer below 2^63 (RocketMQ's Long)", token)
        return value if value < INT32 else Long(value)

    def _float(self, token: _Token) -> float:
        value = float(token.text)
        if value == math.inf:
            raise self.error("a number that fits a Java double", token)
        if value < _DOUBLE_MIN:
            raise self.error(
                "a float literal above zero (RocketMQ refuses 0.0 and what rounds to it: "
                "write 0, or a property compared with 0)",
                token,
            )
        return value
