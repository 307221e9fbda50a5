"""Java ``.properties`` text, as Java's ``Properties.load`` and ``store`` read and write it:
:func:`parse_properties` (and :func:`read_properties_file`) and :func:`format_properties`,
which round-trip. The format of Kafka's ``--command-config`` files and of the client
properties files the project reads (:mod:`topics.client_security` maps their settings)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

from topics.errors import InvalidArgumentError

_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")
"""Java's line terminators in a properties file (and only these: unlike str.splitlines,
U+0085, U+2028, U+000B, U+000C and U+001C-U+001E are not line breaks)."""


class Properties(dict[str, str]):
    """A properties file's key/value pairs and, in :attr:`lines`, the line (1-based) each
    key's last value starts on."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, int] = {}


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, logical line) of a properties file: comments and blank lines
    dropped, lines ending in an odd number of backslashes joined with the next (its leading
    blanks stripped)."""
    pending = ""
    start = 0
    for number, raw in enumerate(_LINE_BREAK.split(text), 1):
        line = raw.lstrip(" \t\f")
        if not pending and (not line or line[0] in "#!"):
            continue
        if not pending:
            start = number
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 == len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
            out.append(chr(int(text[i + 2 : i + 6], 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    # \uXXXX pairs are UTF-16 surrogates (as Java writes characters above U+FFFF): join them.
    return "".join(out).encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def parse_properties(text: str) -> Properties:
    """The key/value pairs of a Java ``.properties`` text (``key=value``, ``key: value`` or
    ``key value``; ``#``/``!`` comments; backslash continuations and escapes; a repeated key's
    last value wins; lines end at ``\\r\\n``, ``\\r`` or ``\\n`` only, as in Java)."""
    out = Properties()
    for number, line in _logical_lines(text):
        i = 0
        while i < len(line):
            if line[i] == "\\":
                i += 2
                continue
            if line[i] in "=: \t\f":
                break
            i += 1
        key, rest = line[:i], line[i:]
        rest = rest.lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        name = _unescape(key)
        out[name] = _unescape(rest)
        out.lines[name] = number
    return out


def read_properties_file(path: str | Path) -> Properties:
    """The properties of the file at ``path`` (:func:`parse_properties`); an unreadable file is
    an :class:`InvalidArgumentError` naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise InvalidArgumentError(
            f"cannot read the client properties file {path}: {reason}"
        ) from None
    return parse_properties(text)


def _java_unicode_escape(m: re.Match[str]) -> str:
    """``\\uXXXX`` for the matched character (two, a UTF-16 surrogate pair, above U+FFFF)."""
    units = m.group(0).encode("utf-16-be", "surrogatepass")
    return "".join(f"\\u{units[i] << 8 | units[i + 1]:04x}" for i in range(0, len(units), 2))


def format_properties(props: Mapping[str, str]) -> str:
    """``props`` as a Java ``.properties`` text that :func:`parse_properties` (and Java) reads
    back to the same pairs. The text is ASCII: every other character, and every control
    character but tab, line feed, carriage return and form feed (escaped as ``\\t`` etc.), is
    written ``\\uXXXX`` (UTF-16), since Java's ``Properties.load`` (Kafka's
    ``--command-config``) reads ISO-8859-1."""

    def escape(text: str, key: bool) -> str:
        out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        out = out.replace("\t", "\\t").replace("\f", "\\f")
        out = re.sub(r"[^\x20-\x7e]", _java_unicode_escape, out)
        if key:
            out = re.sub(r"([=: #!])", r"\\\1", out)
        elif out.startswith((" ", "#", "!")):
            out = "\\" + out
        return out

    return "".join(f"{escape(k, True)}={escape(v, False)}\n" for k, v in props.items())
