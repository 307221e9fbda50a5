"""Output of the ``bridge`` commands for scripts and people.

* ``--json`` prints one JSON object per line on stdout (JSON Lines), nothing else, so scripts
  can parse each line on its own (:func:`json_option`, :func:`emit_json`,
  :func:`message_json`).
* Exit statuses (:data:`EXIT_ERROR`, :data:`EXIT_UNREACHABLE`, :data:`EXIT_NOT_FOUND`; click's
  own 2 for bad usage): a failed command prints one ``Error: ...`` line on stderr.
* :func:`require_broker` fails a read command within ``request_timeout_ms`` when Kafka cannot
  be reached, before it starts reading.
* :func:`progress` shows a progress bar on stderr, only when stderr is a terminal.
* :class:`JsonLogFormatter`: ``--log-format json`` (or ``BRIDGE_LOG_FORMAT=json``), one JSON
  object per log line.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bridge.config import ClientConfig
from bridge.kafka.admin import TopicAdmin
from bridge.message import MessageExt, PropertyValue

F = TypeVar("F", bound=Callable[..., Any])

EXIT_ERROR: Final = 1
"""A command failed (the ``Error:`` line says why)."""
EXIT_UNREACHABLE: Final = 3
"""Kafka could not be reached within ``request_timeout_ms`` (``BrokerUnreachableError``)."""
EXIT_NOT_FOUND: Final = 4
"""The thing asked for (a transaction, a consumer group's DLQ) does not exist."""


class NotFoundError(click.ClickException):
    """What a command was asked about does not exist: exit status :data:`EXIT_NOT_FOUND`."""

    exit_code = EXIT_NOT_FOUND


class UnreachableError(click.ClickException):
    """Kafka could not be reached: exit status :data:`EXIT_UNREACHABLE`."""

    exit_code = EXIT_UNREACHABLE


def json_option(func: F) -> F:
    """``--json``: one JSON object per line instead of the table (parameter ``as_json``)."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="One JSON object per line (JSON Lines) instead of text.",
    )(func)


def emit_json(obj: Mapping[str, Any] | Any) -> None:
    """Print ``obj`` (a mapping or a dataclass) as one JSON line; bytes and other non-JSON
    values become strings."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    click.echo(json.dumps(obj, default=str, ensure_ascii=False, sort_keys=False))


def properties_json(props: Mapping[str, PropertyValue]) -> dict[str, Any]:
    """``properties`` (text values) and ``binary_properties`` (values that are not UTF-8,
    base64) of a message."""
    text = {k: v for k, v in props.items() if isinstance(v, str)}
    binary = {
        k: base64.b64encode(v).decode("ascii") for k, v in props.items() if isinstance(v, bytes)
    }
    return {"properties": text, "binary_properties": binary}


def message_json(msg: MessageExt) -> dict[str, Any]:
    """A received message as JSON: where it was stored, its id, keys, tags, every property
    and the body (``body``: text, or None when not UTF-8; ``body_base64`` always)."""
    try:
        body: str | None = msg.body.decode("utf-8")
    except UnicodeDecodeError:
        body = None
    return {
        "topic": msg.topic,
        "kafka_topic": msg.kafka_topic,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "msg_id": msg.msg_id,
        "born_timestamp_ms": msg.born_timestamp_ms,
        "store_timestamp_ms": msg.store_timestamp_ms,
        "keys": msg.keys,
        "tags": msg.tags,
        "reconsume_times": msg.reconsume_times,
        **properties_json(msg.properties),
        "body_bytes": len(msg.body),
        "body": body,
        "body_base64": base64.b64encode(msg.body).decode("ascii"),
    }


def require_broker(config: ClientConfig) -> None:
    """Raise ``BrokerUnreachableError`` unless Kafka answers a metadata request within
    ``config.request_timeout_ms`` (ms): a read command then fails at once, instead of after
    each of its reads timed out."""
    TopicAdmin(config).list_topics()


stderr_console = Console(stderr=True, highlight=False)
"""Progress bars go to stderr, so stdout stays the command's output."""


class ProgressBar:
    """A progress bar's handle: :meth:`advance` after each unit of work (a no-op when no bar
    is shown)."""

    def __init__(self, progress: Progress | None, task: Any) -> None:
        self._progress = progress
        self._task = task

    def advance(self, amount: int = 1, description: str | None = None) -> None:
        """Count ``amount`` more units done (and show ``description`` instead, if given)."""
        if self._progress is not None:
            if description is None:
                self._progress.advance(self._task, amount)
            else:
                self._progress.update(self._task, advance=amount, description=description)


@contextmanager
def progress(description: str, total: int | None) -> Iterator[ProgressBar]:
    """A progress bar of ``total`` units on stderr while the block runs, only when stderr is
    a terminal (never in scripts or pipes)."""
    if not stderr_console.is_terminal:
        yield ProgressBar(None, None)
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr_console,
        transient=True,
    )
    with bar:
        yield ProgressBar(bar, bar.add_task(description, total=total))


LOG_FORMATS: Final = ("text", "json")
"""The values of ``--log-format`` (``BRIDGE_LOG_FORMAT``)."""

_STANDARD_RECORD_FIELDS: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def shown(text: object) -> str:
    """``text`` for a line of plain output: as it is when printable, else its ``repr``. Record
    fields another Kafka client wrote (tags, message ids, topic names in headers) may hold a
    newline, which would forge a line of output, or terminal escape sequences."""
    if isinstance(text, str) and text.isprintable():
        return text
    return repr(text)


def _text(value: object) -> str:
    """``str(value)``; its ``repr`` when that raises; its type when both raise."""
    for show in (str, repr):
        try:
            return show(value)
        except Exception:  # a log line must not fail on a value
            continue
    return f"<unprintable {type(value).__name__}>"


class JsonLogFormatter(logging.Formatter):
    """One JSON object per log record: ``ts`` (ISO 8601, UTC, ms), ``epoch_ms``, ``level``,
    ``logger``, ``thread``, ``message``, ``exception`` (the traceback, when there is one),
    ``stack`` (with ``stack_info=True``) and any ``extra`` fields. A line is never lost: a
    value JSON cannot hold (a cycle, a dict with keys that are not text, a ``__str__`` that
    raises) is written as its ``repr``, and a message whose arguments do not fit its format as
    the format and the arguments."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        try:
            message = record.getMessage()
        except Exception:  # e.g. log.info("%d", "x"): keep what was logged
            message = f"{_text(record.msg)} % {_text(record.args)}"
        out: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "epoch_ms": int(record.created * 1000),
            "level": record.levelname,
            "logger": record.name,
            "thread": record.threadName,
            "message": message,
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        for name, value in vars(record).items():
            if name not in _STANDARD_RECORD_FIELDS and not name.startswith("_"):
                out[name] = value
        try:
            return json.dumps(out, default=_text, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            safe = {k: _jsonable(v) for k, v in out.items()}
            return json.dumps(safe, default=_text, ensure_ascii=False)


def _jsonable(value: object) -> object:
    """``value`` when JSON can hold it, else its ``repr`` (as text)."""
    try:
        json.dumps(value, default=_text, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        try:
            return repr(value)
        except Exception:  # a log line must not fail on a value
            return f"<unprintable {type(value).__name__}>"
    return value


def configure_logging(verbose: int, log_format: str) -> None:
    """Log at WARNING (``verbose`` 0), INFO (1) or DEBUG (2+) to stderr, as text or as one
    JSON object per line (``log_format`` ``json``), unless the root logger has handlers
    already (the command runs inside a program that set up logging)."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s")
        )
    root = logging.getLogger()
    if not root.handlers:  # as logging.basicConfig: a host that set up logging keeps it
        root.addHandler(handler)
        root.setLevel(level)
    if verbose == 0:
        # librdkafka logs every retriable hiccup (a coordinator still loading, each refused
        # connection while a broker is down); a failed command says why in its one error line,
        # and -v shows these logs.
        logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.CRITICAL)
