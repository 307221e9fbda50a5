"""The ``sasl.jaas.config`` value of Kafka's Java client, for one login module with options
(``...ScramLoginModule required username="alice" password="...";``): :func:`parse_jaas_login`
reads it as Kafka's ``JaasConfig`` (Java's ``StreamTokenizer``) does, :func:`jaas_login` writes
one it reads back. Errors are :class:`~topics.errors.ClientPropertyError` naming
``sasl.jaas.config``, never a value."""

from __future__ import annotations

import re
from typing import Final

from topics.errors import ClientPropertyError

_JAAS_TOKEN: Final = re.compile(
    r"""\s*(?:(?P<quoted>"(?:[^"\\]|\\.)*")|(?P<semi>;)|(?P<eq>=)|(?P<word>[^\s=;"]+))""",
    re.S,
)


# Escapes in a quoted JAAS value, as Java's StreamTokenizer (which Kafka's JaasConfig uses)
# reads them: these letters, an octal \ooo, and any other character as itself.
_JAAS_ESCAPES: Final = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_JAAS_ESCAPE: Final = re.compile(r"\\(?:([0-3][0-7]{0,2}|[4-7][0-7]?)|(.))", re.S)


def _jaas_unquote(quoted: str) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return chr(int(m.group(1), 8))
        return _JAAS_ESCAPES.get(m.group(2), m.group(2))

    return _JAAS_ESCAPE.sub(one, quoted)


def _jaas_tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, value, line number in ``text``) of each token of a JAAS config."""
    tokens: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        if not text[pos:].strip():
            break
        m = _JAAS_TOKEN.match(text, pos)
        if m is None:
            raise ClientPropertyError("sasl.jaas.config", "cannot be parsed (an unclosed quote?)")
        kind = m.lastgroup or ""
        value = m.group(kind)
        if kind == "quoted":
            value = _jaas_unquote(value[1:-1])
        tokens.append((kind, value, text.count("\n", 0, m.start(kind)) + 1))
        pos = m.end()
    return tokens


def parse_jaas_login(text: str) -> tuple[str, dict[str, str]]:
    """(login module class, options) of a one-module ``sasl.jaas.config`` such as
    ``...ScramLoginModule required username="alice" password="...";``. Errors name the
    property and the module or option, never a value, nor the name of an option that follows
    the start of a ``password`` option (an unquoted password with a blank would turn its tail
    into an option): those errors give the line of the JAAS config instead."""
    tokens = _jaas_tokens(text)
    if len(tokens) < 3 or tokens[0][0] != "word" or tokens[1][0] != "word":
        raise ClientPropertyError(
            "sasl.jaas.config", "expected '<LoginModule class> required key=\"value\" ... ;'"
        )
    module, flag = tokens[0][1], tokens[1][1]
    if flag.lower() not in ("required", "requisite", "sufficient", "optional"):
        raise ClientPropertyError("sasl.jaas.config", "the login module's flag must be 'required'")
    options: dict[str, str] = {}
    after_password = False
    rest = tokens[2:]
    while rest and rest[0][0] != "semi":
        if len(rest) < 3 or rest[0][0] != "word" or rest[1][0] != "eq":
            raise ClientPropertyError("sasl.jaas.config", "expected key=value options")
        name = rest[0][1]
        if rest[2][0] not in ("word", "quoted"):
            shown = f"line {rest[0][2]} of the JAAS config" if after_password else repr(name)
            raise ClientPropertyError("sasl.jaas.config", f"option {shown} has no value")
        if after_password and (name in options or name not in _LOGIN_OPTIONS):
            raise ClientPropertyError(
                "sasl.jaas.config",
                f"an option on line {rest[0][2]} of the JAAS config follows the password and "
                "is not supported or repeated (quote a password holding blanks or '=')",
            )
        after_password = after_password or name == "password"
        options[name] = rest[2][1]
        rest = rest[3:]
    if not rest or len(rest) != 1:
        raise ClientPropertyError(
            "sasl.jaas.config", "must hold exactly one login module, ended by ';'"
        )
    return module, options


_LOGIN_OPTIONS: Final = ("username", "password")


def jaas_login(module: str, username: str, password: str) -> str:
    """A ``sasl.jaas.config`` value for ``module`` with a username and password (quoted;
    ``\\``, ``"``, line breaks and tabs escaped, which Java's tokenizer reads back)."""

    def quote(value: str) -> str:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
        value = value.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
        return '"' + value + '"'

    return f"{module} required username={quote(username)} password={quote(password)};"
