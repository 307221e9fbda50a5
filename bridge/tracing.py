"""Tracing: a message's W3C trace context (``traceparent``/``tracestate`` properties,
:data:`bridge.message.TRACE_PROPERTIES`) and OpenTelemetry spans when ``opentelemetry-api`` is
installed (the ``otel`` extra): :func:`send_span` and :func:`inject_trace_context` for the
producer, :func:`process_span` for the push consumer (``docs/tracing.md``). Without it nothing
of OpenTelemetry is imported, and the properties still travel with every copy."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from bridge.message import TRACE_PROPERTIES, Message, MessageConst, MessageExt
from bridge.property_values import PropertyValue, property_text

_logger = logging.getLogger(__name__)

_otel_modules: tuple[Any, Any] | None = None
"""opentelemetry-api's ``trace`` and ``propagate`` modules, once looked for and found."""
_current_context: Callable[[], Mapping[str, object]] | None = None
"""opentelemetry-api's ``context.get_current``, once found."""
_otel_looked = False
"""True once :func:`_opentelemetry` looked for them (set after ``_otel_modules``)."""


def _opentelemetry() -> tuple[Any, Any] | None:
    """opentelemetry-api's ``trace`` and ``propagate`` modules, or None when it is not
    installed (then nothing of it is imported; looked for once, from any thread)."""
    global _otel_modules, _current_context, _otel_looked  # noqa: PLW0603 - filled on first use
    if not _otel_looked:
        try:
            from opentelemetry import context, propagate, trace  # noqa: PLC0415 - optional extra

            _current_context = context.get_current
            _otel_modules = (trace, propagate)
        except ImportError:
            _otel_modules = None
        _otel_looked = True
    return _otel_modules


_provider_set = False
"""True once a tracer provider was found set up (it stays so)."""
_provider_next_look = 0.0
"""While none is set up: when to look again (monotonic seconds)."""
_PROVIDER_LOOK_INTERVAL_S: Final = 1.0
"""How often, at most, a tracer provider set up later is looked for, seconds (looking costs
microseconds on every send and listener call otherwise)."""


def _no_tracer_provider(trace: Any) -> bool:
    """True while no tracer provider is set up (every span would be a no-op); one set up
    later is seen within :data:`_PROVIDER_LOOK_INTERVAL_S`."""
    global _provider_set, _provider_next_look  # noqa: PLW0603 - a cache filled on first use
    if _provider_set:
        return False
    now = time.monotonic()
    if now < _provider_next_look:
        return True
    if isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    ):
        _provider_next_look = now + _PROVIDER_LOOK_INTERVAL_S
        return True
    _provider_set = True
    return False


def tracing_active() -> bool:
    """True if spans would be recorded: opentelemetry-api installed and a tracer provider set
    up. Cheap: senders and listener calls check it before making a span."""
    otel = _opentelemetry()
    return otel is not None and not _no_tracer_provider(otel[0])


def untraced() -> bool:
    """True if a send now would make no span and write no trace context: opentelemetry-api
    is not installed, or no tracer provider is set up (as :func:`tracing_active` sees it)
    and nothing is attached to the current context (so no span is current). One cheap check
    for the common case; when False, :func:`tracing_active` and
    :func:`inject_trace_context` decide."""
    if not _otel_looked:
        _opentelemetry()
    current, otel = _current_context, _otel_modules
    if current is None or otel is None:
        return True  # not installed
    if _provider_set or current():
        return False
    return time.monotonic() < _provider_next_look or _no_tracer_provider(otel[0])


def tracing_available() -> bool:
    """True if opentelemetry-api is installed (the ``otel`` extra): producers then make send
    spans and push consumers process spans."""
    return _opentelemetry() is not None


def trace_carrier(props: Mapping[str, PropertyValue]) -> dict[str, str]:
    """The W3C Trace Context properties of ``props`` as text (what a propagator extracts)."""
    out = {}
    for name in TRACE_PROPERTIES:
        value = props.get(name)
        if value is not None:
            out[name] = value if isinstance(value, str) else property_text(value)
    return out


_MESSAGING_SYSTEM: Final = "rocketmq"
"""``messaging.system`` of the bridge's spans (it speaks RocketMQ's model)."""


class TraceSpan:
    """A span the bridge opened, or nothing (OpenTelemetry missing, or not wanted): what the
    caller reports about the work it covers. Tracing never fails the work: an error of the
    tracing library is logged and ignored."""

    __slots__ = ("span",)

    def __init__(self, span: Any = None) -> None:
        self.span = span

    def set_attribute(self, name: str, value: str | int) -> None:
        """Set attribute ``name`` on the span, if there is one."""
        if self.span is not None:
            try:
                self.span.set_attribute(name, value)
            except Exception:
                _logger.debug("tracing: setting %s failed", name, exc_info=True)

    def failed(self, description: str, exc: BaseException | None = None) -> None:
        """Mark the span failed (``description``), recording ``exc`` if given."""
        if self.span is None:
            return
        try:
            from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415 - optional extra

            if exc is not None:
                self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, description))
        except Exception:
            _logger.debug("tracing: marking a span failed failed", exc_info=True)


def inject_trace_context(msg: Message) -> None:
    """Write the current trace context into ``msg`` as ``traceparent`` (and ``tracestate``)
    if OpenTelemetry is installed, a valid span is current and ``msg`` has no
    ``traceparent`` yet (one the user or another client set is kept as it is)."""
    if MessageConst.TRACE_PARENT in msg._properties:
        return
    otel = _otel_modules if _otel_looked else _opentelemetry()
    if otel is None:
        return
    # An empty context (nothing attached: the common case without a span) holds no span;
    # asking it for one costs several calls on every send.
    if _current_context is not None and not _current_context():
        return
    trace, propagate = otel
    carrier: dict[str, str] = {}
    try:
        if not trace.get_current_span().get_span_context().is_valid:
            return  # nothing to write (the common case without a span): skip the propagator
        propagate.inject(carrier)
    except Exception:
        _logger.warning("tracing: writing the trace context failed", exc_info=True)
        return
    for name in TRACE_PROPERTIES:
        value = carrier.get(name)
        if isinstance(value, str):
            msg.put_system_property(name, value)


@contextlib.contextmanager
def _current_span(start: Callable[[], Any]) -> Iterator[TraceSpan]:
    """Run the block in the span context manager ``start()`` makes; if making or entering it
    fails, without a span (logged): tracing never fails the work."""
    with contextlib.ExitStack() as stack:
        try:
            span = stack.enter_context(start())
        except Exception:
            _logger.warning("tracing: starting a span failed", exc_info=True)
            span = None
        yield TraceSpan(span)


@contextlib.contextmanager
def send_span(msg: Message) -> Iterator[TraceSpan]:
    """A producer span (``<topic> send``, child of the current span) around a send of
    ``msg``, current while it runs so that :func:`inject_trace_context` writes its context
    into the message; only when OpenTelemetry is installed and ``msg`` has no ``traceparent``
    yet (a message that already carries one is sent in its trace, without a span). Without a
    tracer provider set up there is no span (a valid current context, say one a framework
    took from an incoming request, is still written by :func:`inject_trace_context`)."""
    otel = _opentelemetry()
    if otel is None or MessageConst.TRACE_PARENT in msg._properties or _no_tracer_provider(otel[0]):
        yield TraceSpan()
        return
    trace = otel[0]

    def start() -> Any:
        return trace.get_tracer("bridge").start_as_current_span(
            f"{msg.topic} send",
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": _MESSAGING_SYSTEM,
                "messaging.operation.type": "send",
                "messaging.destination.name": str(msg.topic),
            },
        )

    with _current_span(start) as span:
        yield span


@contextlib.contextmanager
def process_span(msgs: list[MessageExt], group: str) -> Iterator[TraceSpan]:
    """A consumer span (``<topic> process``) around a listener call on ``msgs``, whose parent
    is the trace context the first message carries (a new trace if none) and which links the
    others' contexts; nothing when OpenTelemetry is not installed or no tracer provider is
    set up (every span would be a no-op: listener calls skip the cost)."""
    otel = _opentelemetry()
    if otel is None or not msgs:
        yield TraceSpan()
        return
    trace, propagate = otel
    if _no_tracer_provider(trace):
        yield TraceSpan()
        return

    def start() -> Any:
        parent = propagate.extract(trace_carrier(msgs[0]._properties))
        links = []
        for msg in msgs[1:]:
            carrier = trace_carrier(msg._properties)
            if carrier:
                context = trace.get_current_span(propagate.extract(carrier)).get_span_context()
                if context.is_valid:
                    links.append(trace.Link(context))
        first = msgs[0]
        attributes: dict[str, str | int] = {
            "messaging.system": _MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": str(first.topic),
            "messaging.consumer.group.name": group,
            "messaging.batch.message_count": len(msgs),
            "messaging.message.id": first.msg_id,
            "messaging.destination.partition.id": str(first.queue_id),
            "messaging.kafka.offset": first.queue_offset,
        }
        return trace.get_tracer("bridge").start_as_current_span(
            f"{first.topic} process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )

    with _current_span(start) as span:
        yield span
