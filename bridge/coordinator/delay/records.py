"""What the delay services read from and write as a delayed record, in either of its formats
(the header format, or the envelope of earlier releases; see
:func:`~bridge.codec.is_header_format`): its send id, its failed deliveries, its delivery time
as a timer, and the records it becomes (its delivery, its hop to another tier, its back-off
copy). The services decide what a record becomes; this module alone knows how each is laid out,
so a record's way through the coordinator goes down to :mod:`bridge.codec` once per step and
never back up. Pure functions; each raises one of
:data:`~bridge.coordinator.delay.held.RECORD_ERRORS` for a malformed record (it is quarantined).
"""

from __future__ import annotations

from bridge.codec import (
    BORN_TIMESTAMP_HEADER,
    PreparedRecord,
    decode_envelope,
    delayed_headers,
    delivery_record,
    encode_envelope,
    header_delivery_record,
    header_format_message,
    is_header_format,
    last_message_header,
    message_headers_start,
    new_tuple,
)
from bridge.coordinator.delay.held import Headers, Held
from bridge.delay.routing import (
    SEND_ID_HEADER,
    SLOTS_HEADER,
    TIMER_ROUTING_HEADER,
    slots_header,
)
from bridge.errors import MalformedRecordError
from bridge.kafka.transactional import (
    DELIVERY_ATTEMPTS,
    DELIVERY_ERROR,
    MAX_DELIVERY_ERROR_CHARS,
    REMOVED_ON_DELIVERY,
)
from bridge.message import DELAY_PROPERTIES, MessageConst, MessageExt


def attempt_count(raw: str | bytes | None) -> int:
    """A ``DELIVERY_ATTEMPTS`` value as a count (0 when missing or malformed)."""
    try:
        return max(int(raw), 0) if raw else 0
    except ValueError:
        return 0


def send_key(held: Held) -> tuple[int, bytes] | None:
    """(partition, send id) of a record a producer wrote (see
    :data:`bridge.delay.routing.SEND_ID_HEADER`); None for the coordinator's own copies,
    records of other clients and records whose headers could not be read. In the header
    format only the coordinator's headers (those before the born time) are looked at: a
    message property of that name is not a send id."""
    for name, raw in held.headers:
        if name == SEND_ID_HEADER and raw:
            return (held.partition, raw)
        if name == BORN_TIMESTAMP_HEADER:
            break
    return None


def written_slots(held: Held) -> int | None:
    """The slot count ``held``'s partition was picked with (its
    :data:`~bridge.delay.routing.SLOTS_HEADER`), None without one (lane 0, or written
    before the header) or when it is no positive number (the record is then read by its
    partition). Only the coordinator's headers (those before the born time) are looked at."""
    for name, raw in held.headers:
        if name == SLOTS_HEADER:
            try:
                count = int(raw) if raw else 0
            except ValueError:
                return None
            return count if count > 0 else None
        if name == BORN_TIMESTAMP_HEADER:
            break
    return None


def failed_deliveries(held: Held) -> int:
    """How many deliveries of ``held`` failed before (its ``DELIVERY_ATTEMPTS``)."""
    headers = held.headers
    if headers and is_header_format(headers):
        start = message_headers_start(headers)
        return attempt_count(last_message_header(headers, DELIVERY_ATTEMPTS, start))
    return attempt_count(decode_envelope(held.record.value()).get_property(DELIVERY_ATTEMPTS))


def delivery(held: Held, namespace: str) -> PreparedRecord:
    """The real-topic record of a delayed message that is due: a header rewrite of a
    header-format record (:func:`~bridge.codec.header_delivery_record`), or built from the
    envelope's fields of one written before (:func:`~bridge.codec.delivery_record`). A record
    whose headers could not be read is taken for an envelope record (the bridge never wrote a
    header-format record such headers; if its value is no envelope, it is quarantined)."""
    headers = held.headers
    if headers and is_header_format(headers):
        return header_delivery_record(headers, held.record.value(), namespace, REMOVED_ON_DELIVERY)
    return delivery_record(held.record.value(), namespace, REMOVED_ON_DELIVERY)


def _time_ms(where: str, raw: str | bytes) -> int:
    """``raw``, the value of a ``TIMER_DELIVER_MS`` header or property (``where``), as epoch
    ms; :class:`MalformedRecordError` naming it and its value (the first 64 characters) if it
    is no integer."""
    try:
        return int(raw)
    except ValueError:  # not digits, or more than int() reads (4300 digits)
        text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        raise MalformedRecordError(
            f"{where} {TIMER_ROUTING_HEADER} is not a time: {text[:64]!r}"
        ) from None


def timer_deliver_ms(held: Held) -> int:
    """The delivery time of the timer record ``held``, epoch ms: its last
    ``TIMER_DELIVER_MS`` header, else (a record of another client, or whose headers could not
    be read) its envelope's property; 0 (due now) for a header-format record without one.
    Raises one of :data:`~bridge.coordinator.delay.held.RECORD_ERRORS` (the record is quarantined):
    :class:`MalformedRecordError` for a time that is no integer."""
    raw = last_message_header(held.headers, TIMER_ROUTING_HEADER)
    if raw is not None:
        return _time_ms("header", raw)
    if held.headers and is_header_format(held.headers):
        return 0  # no time: due now (delivery quarantines it if it is malformed otherwise)
    # Written by another client, or headers unreadable: the envelope has it.
    wanted = decode_envelope(held.record.value()).get_property(TIMER_ROUTING_HEADER)
    return _time_ms("property", wanted) if wanted else 0


def hop(held: Held, topic: str, deliver_ms: int, partition: int, slots: int) -> PreparedRecord:
    """The timer record ``held`` (of ``topic``), due at ``deliver_ms``, copied to partition
    ``partition`` of ``topic`` (one of the tier it goes to; ``slots`` tiers). A hop is the
    coordinator's own copy, written once in a Kafka transaction: without the producer's send
    id, it can never pass for a second copy of that send; with the slot count it was routed
    with past lane 0 (:func:`~bridge.delay.routing.slots_header`)."""
    headers: Headers
    own = (SEND_ID_HEADER, SLOTS_HEADER)
    if is_header_format(held.headers):
        # The coordinator's headers (before and with the born time) without the send id,
        # then the message's (its TIMER_DELIVER_MS among them) as they are.
        start = message_headers_start(held.headers)
        headers = slots_header(partition, slots)
        headers += [h for h in held.headers[:start] if h[0] not in own]
        headers += held.headers[start:]
    else:  # an envelope record
        headers = [(k, v) for k, v in held.headers if k != TIMER_ROUTING_HEADER and k not in own]
        headers.append((TIMER_ROUTING_HEADER, str(deliver_ms).encode()))
        headers += slots_header(partition, slots)
    record = held.record
    return new_tuple(
        PreparedRecord,
        (
            topic,
            record.key(),
            record.value(),
            headers,
            f"{topic}-{held.partition}-{held.offset}",
            0,
            partition,
        ),
    )


def backoff_source(held: Held, namespace: str) -> tuple[int, str, MessageExt | None]:
    """What a back-off copy of ``held`` starts from: (its failed deliveries so far, its
    message id, its message when it is an envelope record; None for a header-format one,
    which is checked to be deliverable at all)."""
    if held.headers and is_header_format(held.headers):
        start = message_headers_start(held.headers)
        raw_attempts = last_message_header(held.headers, DELIVERY_ATTEMPTS, start)
        # Checks it is deliverable at all (else quarantined, with the reason).
        msg_id = header_delivery_record(held.headers, None, namespace, REMOVED_ON_DELIVERY).msg_id
        return attempt_count(raw_attempts), msg_id, None
    msg = decode_envelope(held.record.value())
    return attempt_count(msg.get_property(DELIVERY_ATTEMPTS)), msg.msg_id, msg


def backoff_copy(
    held: Held,
    msg: MessageExt | None,
    attempts: int,
    problem: str,
    deliver_ms: int,
    *,
    envelope: bool,
) -> tuple[bytes | None, Headers]:
    """(value, headers) of the copy of ``held`` that waits in the timer topic until
    ``deliver_ms`` after its delivery failed (``problem``) ``attempts`` times; ``msg`` as
    :func:`backoff_source` gave it. The copy is in the header format, whichever format ``held``
    was in, or with ``envelope`` the record releases before it wrote (an envelope with
    ``TIMER_DELIVER_MS`` as its one header)."""
    again = (
        (DELIVERY_ATTEMPTS, str(attempts).encode()),
        (DELIVERY_ERROR, problem[:MAX_DELIVERY_ERROR_CHARS].encode()),
        (MessageConst.TIMER_DELIVER_MS, str(deliver_ms).encode()),
    )
    dropped = {*DELAY_PROPERTIES, DELIVERY_ATTEMPTS, DELIVERY_ERROR}
    headers: Headers
    if envelope:
        if msg is None:
            msg = header_format_message(held.headers, held.record.value())
        props = {k: v for k, v in msg.properties.items() if k not in DELAY_PROPERTIES}
        props[DELIVERY_ATTEMPTS] = str(attempts)
        props[DELIVERY_ERROR] = problem[:MAX_DELIVERY_ERROR_CHARS]
        props[MessageConst.TIMER_DELIVER_MS] = str(deliver_ms)
        value = encode_envelope(msg.msg_id, msg.body, props, msg.born_timestamp_ms, msg.born_host)
        return value, [again[2]]
    if msg is None:
        # The born time and the message's headers, in their order, the delay and attempt ones
        # replaced; the producer's send id is left out.
        start = message_headers_start(held.headers)
        headers = [(BORN_TIMESTAMP_HEADER, held.headers[start - 1][1])]
        headers += [h for h in held.headers[start:] if h[0] not in dropped]
        headers += again
        return held.record.value(), headers
    props = {k: v for k, v in msg.properties.items() if k not in dropped}
    headers = delayed_headers([], msg.msg_id, msg.born_host, props, msg.born_timestamp_ms)
    headers += again
    return msg.body, headers
