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
Long      :class:`_Long`, an ``int`` subclass (a larger literal, or one with ``L``)
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

import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeAlias

from bridge.errors import FilterExpressionError

__all__ = ["PropertyLookup", "SqlFilter", "compile_sql92"]

PropertyLookup: TypeAlias = Callable[[str], "str | bytes | None"]
"""A message's property by name: text, bytes (not UTF-8: read as RocketMQ's broker would
decode them, with U+FFFD for what is not UTF-8) or None when missing."""


class _Long(int):
    """A Java ``Long`` (a plain ``int`` is an ``Integer``)."""

    __slots__ = ()


Value: TypeAlias = "int | float | str | bool | None"
Eval: TypeAlias = Callable[[PropertyLookup], Value]


class _EvaluationError(Exception):
    """What RocketMQ's evaluation throws (a NumberFormatException, a ClassCastException): the
    message does not match."""


# --- Java's conversions ------------------------------------------------------------------

_INT32: Final = 1 << 31
_INT64: Final = 1 << 63
_JAVA_INTEGER: Final = re.compile(r"[+-]?(\d+)")
"""``Integer.valueOf``/``Long.valueOf``: a sign, then decimal digits of any script
(``Character.digit``; ``\\d`` on text is Unicode's decimal digits too), nothing else."""
_JAVA_DOUBLE: Final = re.compile(
    r"[+-]?(?:NaN|Infinity"
    r"|(?P<dec>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)[fFdD]?"
    r"|(?P<hex>0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?\d+)[fFdD]?)",
    re.ASCII,
)
"""``Double.valueOf`` (after trimming): ASCII digits only, an optional type suffix, ``NaN``,
``Infinity`` and hexadecimal floats. Python's ``float`` accepts more (``inf``, ``1_0``,
other scripts' digits), so it only ever sees text this accepted. No two parts may match the
same digits (``\\d+\\.?\\d*`` could split a run of digits anywhere): property values come from
producers, and a long run of digits that does not match must fail in linear time."""
_JAVA_TRIM: Final = "".join(map(chr, range(0x21)))
"""``String.trim`` removes every character up to U+0020 at both ends."""


def _java_integer(text: str, bits: int) -> int:
    """``Integer.valueOf`` (``bits`` 32) or ``Long.valueOf`` (64) of ``text``."""
    match = _JAVA_INTEGER.fullmatch(text)
    if match is None:
        raise _EvaluationError(f"not an integer: {text!r}")
    digits = match.group(1)
    if len(digits) > 20:  # int() refuses very long text; leading zeros are no value
        first = next((i for i, c in enumerate(digits) if unicodedata.digit(c) != 0), None)
        if first is None:
            return 0
        if len(digits) - first > 20:
            raise _EvaluationError(f"out of range: {text!r}")
        text = text[: match.start(1)] + digits[first:]
    value = int(text)
    limit = _INT32 if bits == 32 else _INT64
    if not -limit <= value < limit:
        raise _EvaluationError(f"out of range: {text!r}")
    return value if bits == 32 else _Long(value)


def _java_double(text: str) -> float:
    """``Double.valueOf(text)``."""
    trimmed = text.strip(_JAVA_TRIM)
    match = _JAVA_DOUBLE.fullmatch(trimmed)
    if match is None:
        raise _EvaluationError(f"not a number: {text!r}")
    negative = trimmed.startswith("-")
    if match.group("dec") is not None:
        value = float(match.group("dec"))
    elif match.group("hex") is not None:
        try:
            value = float.fromhex(match.group("hex"))
        except OverflowError:
            value = math.inf
    else:
        value = math.nan if "N" in trimmed else math.inf
    return -value if negative else value


def _java_boolean(text: str) -> bool:
    """``Boolean.valueOf(text)``: true for "true" in any case, false for anything else."""
    return len(text) == 4 and text.isascii() and text.lower() == "true"


def _compare_doubles(a: float, b: float) -> int:
    """``Double.compare``: NaN above everything and equal to itself, -0.0 below 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan, b_nan = a != a, b != b  # noqa: PLR0124 - NaN is the one value unequal to itself
    if a_nan or b_nan:
        return int(a_nan) - int(b_nan)
    a_sign, b_sign = math.copysign(1.0, a), math.copysign(1.0, b)
    return (a_sign > b_sign) - (a_sign < b_sign)


def _raise_boolean_string(left: Value, right: Value) -> tuple[Value, Value]:
    raise _EvaluationError("a boolean compared with a string")  # Java's ClassCastException


_PROMOTIONS: Final[dict[tuple[type, type], Callable[[Any, Any], tuple[Value, Value]]]] = {
    (int, _Long): lambda left, right: (_Long(left), right),
    (int, float): lambda left, right: (float(left), right),
    (int, str): lambda left, right: (left, _java_integer(right, 32)),
    (_Long, int): lambda left, right: (left, _Long(right)),
    (_Long, float): lambda left, right: (float(left), right),
    (_Long, str): lambda left, right: (left, _java_integer(right, 64)),
    (float, int): lambda left, right: (left, float(right)),
    (float, _Long): lambda left, right: (left, float(right)),
    (float, str): lambda left, right: (left, _java_double(right)),
    (str, bool): lambda left, right: (_java_boolean(left), right),
    (str, int): lambda left, right: (_java_integer(left, 32), right),
    (str, _Long): lambda left, right: (_java_integer(left, 64), right),
    (str, float): lambda left, right: (_java_double(left), right),
    # RocketMQ casts the Boolean on the left to a String.
    (bool, str): _raise_boolean_string,
}
"""``ComparisonExpression.__compare``'s promotions (string conversion on, as RocketMQ's parser
sets it), by (left type, right type): to the right's type, a number to the wider one, text
parsed as the number's type. Pairs not listed cannot be compared: -1."""


def _compare(left: Value, right: Value) -> int:
    """``ComparisonExpression.__compare``: the operands promoted to one type, then compared
    as Java's ``compareTo`` does; -1 when they cannot be promoted."""
    if type(left) is not type(right):
        promote = _PROMOTIONS.get((type(left), type(right)))
        if promote is None:
            return -1
        left, right = promote(left, right)
    if type(left) is float:
        return _compare_doubles(left, right)  # type: ignore[arg-type]
    if type(left) is str:
        # Only '=' compares text (an ordering reads both as numbers first), so equality is all
        # of String.compareTo that shows.
        return 0 if left == right else 1
    return (left > right) - (left < right)  # type: ignore[operator]


def _negate(value: Value) -> Value:
    """``-value``: null unless a number; Integer and Long wrap around as in Java."""
    kind = type(value)
    if kind is int:
        return (-value + _INT32) % (2 * _INT32) - _INT32  # type: ignore[operator]
    if kind is _Long:
        return _Long((-value + _INT64) % (2 * _INT64) - _INT64)  # type: ignore[operator]
    if kind is float:
        return -value  # type: ignore[operator]
    return None


# --- the syntax tree ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Node:
    position: int
    """Where the node's text starts in the expression (for errors)."""
    text: str
    """The token that makes it (for errors)."""


@dataclass(frozen=True, slots=True)
class _Constant(_Node):
    value: Value
    boolean: bool = False
    """TRUE, FALSE or NULL: RocketMQ's ``BooleanConstantExpression``, a boolean expression."""


@dataclass(frozen=True, slots=True)
class _Property(_Node):
    name: str


@dataclass(frozen=True, slots=True)
class _Negate(_Node):
    operand: _Node


@dataclass(frozen=True, slots=True)
class _Not(_Node):
    operand: _Node


@dataclass(frozen=True, slots=True)
class _BooleanCast(_Node):
    """A property where a boolean is expected: FALSE when present (its value is text)."""

    operand: _Property


@dataclass(frozen=True, slots=True)
class _Logic(_Node):
    """AND or OR of two or more conditions: a chain ``a OR b OR c`` is one node, evaluated
    left to right as RocketMQ's left-nested pairs are, so that a long list of alternatives
    nests no deeper than two."""

    is_and: bool
    operands: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _Equal(_Node):
    left: _Node
    right: _Node


@dataclass(frozen=True, slots=True)
class _Order(_Node):
    operator: str
    left: _Node
    right: _Node


@dataclass(frozen=True, slots=True)
class _Between(_Node):
    """``value [NOT] BETWEEN low AND high``: RocketMQ's ``(value >= low) AND (value <= high)``,
    or ``(value < low) OR (value > high)``, with ``value`` evaluated once rather than once per
    comparison (it is the same text, and evaluating it again gives the same result): shared,
    a value holding another BETWEEN would double the work at each level."""

    value: _Node
    low: _Node
    high: _Node
    negated: bool


@dataclass(frozen=True, slots=True)
class _In(_Node):
    operand: _Property
    values: frozenset[str]
    negated: bool


@dataclass(frozen=True, slots=True)
class _StringTest(_Node):
    operator: str
    operand: _Node
    search: str
    negated: bool


_BOOLEAN_NODES: Final = (_Not, _BooleanCast, _Logic, _Equal, _Order, _Between, _In, _StringTest)


def _children(node: _Node) -> tuple[_Node, ...]:
    if isinstance(node, _Logic):
        return node.operands
    if isinstance(node, _Equal | _Order):
        return (node.left, node.right)
    if isinstance(node, _Between):
        return (node.value, node.low, node.high)
    if isinstance(node, _Negate | _Not | _BooleanCast | _In | _StringTest):
        return (node.operand,)
    return ()


_MAX_NESTING: Final = 64
"""Parentheses, NOT and signs nested in one another, at most: the parser recurses once per
level (RocketMQ's, in Java, turns the stack overflow of a much deeper one into an invalid
expression; Python's stack is shorter, so the limit is explicit and an error names it)."""
_MAX_DEPTH: Final = 128
"""Levels of the syntax tree, at most: building the filter and evaluating it recurse once per
level. Chains of AND and OR are one level each (:class:`_Logic`); chains such as
``a IS NULL IS NULL ...`` or ``a = 1 = TRUE = ...`` add one level per operator."""


def _too_deep(root: _Node) -> _Node | None:
    """The first node found deeper than :data:`_MAX_DEPTH` in ``root``'s tree (walked
    without recursion), or None."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_DEPTH:
            return node
        stack.extend((child, depth + 1) for child in _children(node))
    return None


def _is_boolean(node: _Node) -> bool:
    """RocketMQ's ``BooleanExpression``: what can stand where a condition is expected."""
    return isinstance(node, _BOOLEAN_NODES) or (isinstance(node, _Constant) and node.boolean)


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


class _Parser:
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

    def refuse(self, node: _Node, expected: str) -> FilterExpressionError:
        return self._error(node.position, node.text, expected)

    def _error(self, position: int, text: str, expected: str) -> FilterExpressionError:
        # The text as written: a keyword's token is upper-cased (``and`` is ``AND``).
        found = self.expression[position : position + len(text)]
        return FilterExpressionError(self.expression, position, found, expected)

    def condition(self, node: _Node) -> _Node:
        """RocketMQ's ``asBooleanExpression``: a property is read as a boolean; anything else
        must be a condition."""
        if _is_boolean(node):
            return node
        if isinstance(node, _Property):
            return _BooleanCast(node.position, node.text, node)
        raise self.refuse(node, "a condition (this does not result in a boolean value)")

    # --- grammar
    def parse(self) -> _Node:
        node = self.condition(self.disjunction())
        if self.token.kind != _Kind.END:
            raise self.error(
                "the end of the expression, AND, OR or a comparison (RocketMQ would ignore "
                "the rest; refused so that it cannot change the meaning unseen)"
            )
        deepest = _too_deep(node)
        if deepest is not None:
            raise self.refuse(deepest, f"an expression nested at most {_MAX_DEPTH} operators deep")
        return node

    def disjunction(self) -> _Node:
        return self._chain("OR", self.conjunction)

    def conjunction(self) -> _Node:
        return self._chain("AND", self.equality)

    def _chain(self, keyword: str, operand: Callable[[], _Node]) -> _Node:
        """``operand (keyword operand)*`` as one :class:`_Logic`; each side is checked to be a
        condition once the operand after it is read, in the order RocketMQ's parser checks."""
        left = operand()
        if not self._is(keyword):
            return left
        op = self.token
        operands: list[_Node] = []
        while self._is(keyword):
            self._advance()
            right = operand()
            if not operands:
                operands.append(self.condition(left))
            operands.append(self.condition(right))
        return _Logic(op.position, op.text, keyword == "AND", tuple(operands))

    def equality(self) -> _Node:
        left = self.comparison()
        while True:
            token = self.token
            if self._is("=") or self._is("<>"):
                self._advance()
                right = self.comparison()
                self._check_equal_operands(left, right)
                left = _Equal(token.position, token.text, left, right)
                if token.text == "<>":
                    left = _Not(token.position, token.text, left)
            elif self._is("IS"):
                self._advance()
                negated = self._is("NOT")
                if negated:
                    self._advance()
                self._expect("NULL", "NULL or NOT NULL after IS")
                null = _Constant(token.position, token.text, None, boolean=True)
                left = _Equal(token.position, token.text, left, null)
                if negated:
                    left = _Not(token.position, token.text, left)
            else:
                return left

    def _check_equal_operands(self, left: _Node, right: _Node) -> None:
        for side in (left, right):
            if isinstance(side, _Constant) and side.value is None:
                raise self.refuse(side, "a value to compare with (use IS NULL to test for null)")
        if (
            isinstance(left, _Constant)
            and isinstance(right, _Constant)
            and left.boolean
            and not right.boolean
        ):
            raise self.refuse(right, f"TRUE or FALSE to compare {left.text} with")

    def _check_ordered(self, node: _Node, op: str) -> _Node:
        """RocketMQ's ``checkLessThanOperand``: a number constant, a property or a negation."""
        if isinstance(node, _Constant):
            if node.boolean or type(node.value) is str:
                raise self.refuse(node, f"a number or a property to compare with {op}")
        elif _is_boolean(node):
            raise self.refuse(node, f"a number or a property to compare with {op}, not a condition")
        return node

    def comparison(self) -> _Node:
        left = self.unary()
        while True:
            token = self.token
            negated = self._is("NOT")
            op = self._peek() if negated else token
            if not negated and token.kind == _Kind.PUNCT and token.text in ("<", "<=", ">", ">="):
                self._advance()
                right = self.unary()
                left = _Order(
                    token.position,
                    token.text,
                    token.text,
                    self._check_ordered(left, token.text),
                    self._check_ordered(right, token.text),
                )
            elif op.kind == _Kind.KEYWORD and op.text in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
                self.index += 2 if negated else 1
                search = self._string(f"a string after {op.text}")
                left = _StringTest(token.position, token.text, op.text, left, search, negated)
            elif self._is("BETWEEN", op):
                self.index += 2 if negated else 1
                low = self.unary()
                self._expect("AND", "AND between the bounds of BETWEEN")
                high = self.unary()
                left = self._between(token, left, low, high, negated)
            elif self._is("IN", op):
                self.index += 2 if negated else 1
                if not isinstance(left, _Property):
                    raise self.refuse(left, "a property before IN")
                self._expect("(", "( after IN")
                values = [self._string("a string in the IN list")]
                while self._is(","):
                    self._advance()
                    values.append(self._string("a string in the IN list"))
                self._expect(")", ", or ) in the IN list")
                left = _In(token.position, token.text, left, frozenset(values), negated)
            elif negated:
                raise self.error("CONTAINS, STARTSWITH, ENDSWITH, BETWEEN or IN after NOT", op)
            else:
                return left

    def _between(
        self, token: _Token, value: _Node, low: _Node, high: _Node, negated: bool
    ) -> _Node:
        if negated:  # (value < low) OR (value > high), with no check of the bounds
            what = "NOT BETWEEN"
            self._check_ordered(value, what)
            self._check_ordered(low, what)
            self._check_ordered(high, what)
            return _Between(token.position, token.text, value, low, high, negated)
        if isinstance(low, _Constant) and isinstance(high, _Constant):
            if low.value is None or high.value is None:
                raise self.refuse(low if low.value is None else high, "BETWEEN bounds, not NULL")
            try:
                reversed_bounds = _compare(high.value, low.value) < 0
            except _EvaluationError:
                reversed_bounds = True
            if reversed_bounds:
                raise self.refuse(
                    high, f"an upper bound of BETWEEN comparable with {low.text} and not below it"
                )
        self._check_ordered(value, "BETWEEN")
        self._check_ordered(low, "BETWEEN")
        self._check_ordered(high, "BETWEEN")
        return _Between(token.position, token.text, value, low, high, negated)

    def _string(self, expected: str) -> str:
        token = self.token
        if token.kind != _Kind.STRING:
            raise self.error(expected)
        self._advance()
        return token.text[1:-1].replace("''", "'")

    def unary(self) -> _Node:
        if self.nesting >= _MAX_NESTING:
            raise self.error(
                f"an expression nested at most {_MAX_NESTING} deep in parentheses, NOT and signs"
            )
        self.nesting += 1
        try:
            return self._unary()
        finally:
            self.nesting -= 1

    def _unary(self) -> _Node:
        token = self.token
        if self._is("+"):
            self._advance()
            return self.unary()
        if self._is("-"):
            self._advance()
            return _Negate(token.position, token.text, self.unary())
        if self._is("NOT"):
            self._advance()
            return _Not(token.position, token.text, self.condition(self.unary()))
        return self.primary()

    def primary(self) -> _Node:
        token = self.token
        kind = token.kind
        if kind == _Kind.STRING:
            return _Constant(token.position, token.text, self._string(""))
        if kind == _Kind.DECIMAL:
            self._advance()
            return _Constant(token.position, token.text, self._decimal(token))
        if kind == _Kind.FLOAT:
            self._advance()
            return _Constant(token.position, token.text, self._float(token))
        if kind == _Kind.ID:
            self._advance()
            return _Property(token.position, token.text, token.text)
        if kind == _Kind.KEYWORD and token.text in ("TRUE", "FALSE", "NULL"):
            self._advance()
            value = {"TRUE": True, "FALSE": False, "NULL": None}[token.text]
            return _Constant(token.position, token.text, value, boolean=True)
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
        value = int(digits) if len(digits) <= len(str(_INT64)) else _INT64
        if value >= _INT64:
            raise self.error("an integer below 2^63 (RocketMQ's Long)", token)
        return value if value < _INT32 else _Long(value)

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


# --- evaluation ----------------------------------------------------------------------------


def _compile(node: _Node) -> Eval:  # noqa: PLR0911 - one case per node type
    """``node`` as a function of a message's properties, built once: evaluation walks no tree
    and parses nothing."""
    if isinstance(node, _Constant):
        value = node.value
        return lambda _props: value
    if isinstance(node, _Property):
        return _property(node.name)
    if isinstance(node, _Negate):
        operand = _compile(node.operand)
        return lambda props: _negate(operand(props))
    if isinstance(node, _Not):
        return _not(_compile(node.operand))
    if isinstance(node, _BooleanCast):
        read = _property(node.operand.name)
        return lambda props: None if read(props) is None else False
    if isinstance(node, _Logic):
        return _logic(tuple(map(_compile, node.operands)), decisive=not node.is_and)
    if isinstance(node, _Equal):
        return _equal(_compile(node.left), _compile(node.right))
    if isinstance(node, _Order):
        return _order(node.operator, _compile(node.left), _compile(node.right))
    if isinstance(node, _Between):
        return _between(_compile(node.value), _compile(node.low), _compile(node.high), node.negated)
    if isinstance(node, _In):
        return _in(_property(node.operand.name), node.values, node.negated)
    if isinstance(node, _StringTest):
        return _string_test(node.operator, _compile(node.operand), node.search, node.negated)
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
        return _compare(lv, rv) == 0  # Double's order: NaN = NaN is TRUE, 0.0 = -0.0 FALSE

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
        return holds(_compare_doubles(_java_double(lv), _java_double(rv)))
    return holds(_compare(lv, rv))


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


# --- the public face -----------------------------------------------------------------------


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
        except _EvaluationError:
            return False

    def evaluate(self, props: PropertyLookup) -> bool | None:
        """The expression's value: TRUE, FALSE or None (null, or an evaluation error)."""
        try:
            value = self._evaluate(props)
        except _EvaluationError:
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
    return SqlFilter(expression, _compile(_Parser(expression).parse()))
