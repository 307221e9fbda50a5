"""RocketMQ 5's names (``bridge.v5``): how a ``ClientConfiguration`` becomes a ``ClientConfig``,
how a v5 ``Message`` becomes the record a ``bridge.Message`` makes, how a checker's
``TransactionResolution`` and a listener's ``ConsumeResult`` map onto the project's
statuses, and the errors of each front before anything is sent (no broker here; sends,
transactions and consumption are in tests/integration/test_v5_api.py)."""

from __future__ import annotations

import gc
import logging
import math
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import bridge
from bridge import ClientConfig, ConsumeStatus, MessageConst, MessageExt, TransactionStatus
from bridge import Message as Message4
from bridge import Producer as Producer4
from bridge.aio import SimpleConsumer as AsyncSimpleConsumer
from bridge.client_configuration import as_client_config, kafka_bootstrap_servers
from bridge.errors import (
    BrokerUnreachableError,
    FilterExpressionError,
    IllegalStateError,
    InvalidArgumentError,
    InvalidDelayError,
    InvalidMessageError,
    InvalidPropertyError,
    InvalidTopicNameError,
    SendError,
    SendTimeoutError,
)
from bridge.transaction import HalfMessage, TransactionMQProducer
from bridge.v5 import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    FilterType,
    Message,
    MessageListener,
    MessageView,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from bridge.v5.message import DELIVERY_TIMESTAMP_MAX_S, as_message
from bridge.v5.push_consumer import consume_status
from bridge.v5.transaction import Transaction, checker_listener, transaction_status
from tests.conftest import wait_until

UNREACHABLE = "127.0.0.1:1"
"""Nothing is sent in these tests: no client here connects."""


# --- the names ------------------------------------------------------------------------------
def test_the_v5_client_names_are_all_in_one_module() -> None:
    # RocketMQ 5's Python client exports these from `rocketmq` (LitePushConsumer aside: lite
    # topics are not built).
    v5 = {
        "Producer", "TransactionChecker", "Transaction", "TransactionResolution",
        "SimpleConsumer", "PushConsumer", "MessageListener", "ConsumeResult", "Message",
        "FilterExpression", "SendReceipt", "ClientConfiguration", "Credentials",
    }  # fmt: skip
    assert v5 <= set(bridge.v5.__all__)
    assert all(hasattr(bridge.v5, name) for name in bridge.v5.__all__)
    # The 4.x names are untouched; the shared ones are the same classes.
    assert bridge.Producer is Producer4 and bridge.Message is Message4
    assert (
        len({bridge.Producer, bridge.Message, bridge.PushConsumer, Producer, Message, PushConsumer})
        == 6
    )
    assert bridge.SimpleConsumer is SimpleConsumer
    assert bridge.FilterExpression is FilterExpression
    assert FilterType("SQL92") is FilterType.SQL  # the v5 client's name, an alias
    assert FilterType.TAG is bridge.FilterExpressionType.TAG


# --- ClientConfiguration --------------------------------------------------------------------
_HOSTS = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,12}(\.[a-z][a-z0-9-]{0,8}){0,2}", fullmatch=True),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
)


@given(
    st.lists(st.tuples(_HOSTS, st.integers(1, 65535)), min_size=1, max_size=4),
    st.sampled_from([";", ",", "; ", " , "]),
    st.sampled_from(["", "http://", "https://", "HTTP://"]),
    st.booleans(),
)
def test_endpoints_become_the_bootstrap_servers(
    addresses: list[tuple[str, int]], separator: str, prefix: str, trailing: bool
) -> None:
    endpoints = separator.join(f"{prefix}{host}:{port}" for host, port in addresses)
    if trailing:  # RocketMQ 5's client skips empty addresses
        endpoints += separator
    expected = ",".join(f"{host}:{port}" for host, port in addresses)
    assert kafka_bootstrap_servers(endpoints) == expected
    config = ClientConfiguration(endpoints).to_client_config()
    assert config.bootstrap_servers == expected


@pytest.mark.parametrize(
    "endpoints",
    ["", " ; ", "broker", "broker:", ":9092", "broker:0", "broker:65536", "broker:x9",
     "bro ker:9092", "::1:9092", "broker:٩٠٩٢", "user@broker:9092", "broker:9092/path"],
)  # fmt: skip
def test_endpoints_that_are_not_host_and_port_are_refused_by_name(endpoints: str) -> None:
    with pytest.raises(InvalidArgumentError, match="endpoint") as refused:
        ClientConfiguration(f"ok:1;{endpoints}" if endpoints.strip(" ;") else endpoints)
    if endpoints.strip(" ;"):
        assert repr(endpoints) in str(refused.value)


def test_namespace_and_request_timeout_map_onto_the_client_config() -> None:
    default = ClientConfiguration("b:9092", Credentials()).to_client_config()
    assert default == ClientConfig(bootstrap_servers="b:9092")  # RocketMQ 5's "" -> rmq
    assert default.send_msg_timeout_ms == 3000  # request_timeout=3 s, RocketMQ 5's default
    config = ClientConfiguration("b:9092", None, "team-a", 0.25).to_client_config()
    assert (config.namespace, config.send_msg_timeout_ms) == ("team-a", 250)
    assert (
        ClientConfiguration("b:1", request_timeout=1.0001).to_client_config().send_msg_timeout_ms
        == 1001
    )
    with pytest.raises(InvalidTopicNameError):
        ClientConfiguration("b:9092", namespace="team_a")
    for bad in (0, -1, True, "3", math.nan):
        with pytest.raises(InvalidArgumentError, match="request_timeout"):
            ClientConfiguration("b:9092", request_timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="Credentials"):
        ClientConfiguration("b:9092", ("ak", "sk"))  # type: ignore[arg-type]


def test_credentials_are_a_sasl_login_over_tls_unless_kafka_says_otherwise() -> None:
    kafka = ClientConfiguration("b:9093", Credentials("alice", "pw")).to_client_config().kafka
    assert dict(kafka) == {
        "sasl.username": "alice",
        "sasl.password": "pw",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
    }
    given = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN", "ssl.x": "1"}
    kafka = ClientConfiguration("b:1", Credentials("a", "p"), kafka=given).to_client_config().kafka
    assert dict(kafka) == {**given, "sasl.username": "a", "sasl.password": "p"}
    # No login: the kafka properties as given (TLS alone, say); None is RocketMQ 5's empty.
    for empty in (None, Credentials(), Credentials(None, None)):  # type: ignore[arg-type]
        config = ClientConfiguration("b:1", empty, kafka={"security.protocol": "SSL"})
        assert dict(config.to_client_config().kafka) == {"security.protocol": "SSL"}


@pytest.mark.parametrize(
    ("credentials", "kafka", "problem"),
    [
        (Credentials("alice", "pw"), {"security.protocol": "SSL"}, "SASL_SSL or SASL_PLAINTEXT"),
        (Credentials("alice", "pw"), {"sasl.mechanism": "GSSAPI"}, "SCRAM-SHA-512"),
        (Credentials("alice", "pw"), {"sasl.username": "bob"}, "both name the SASL login"),
        (Credentials("alice", "pw"), {"bootstrap.servers": "x:1"}, "bootstrap_servers"),
    ],
)
def test_credentials_that_kafka_contradicts_are_refused(
    credentials: Credentials, kafka: dict[str, str], problem: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=problem):
        ClientConfiguration("b:1", credentials, kafka=kafka)


def test_half_a_login_is_refused_and_no_secret_is_ever_shown() -> None:
    for ak, sk in (("alice", ""), ("", "pw")):
        with pytest.raises(InvalidArgumentError, match="both ak"):
            Credentials(ak, sk)
    with pytest.raises(InvalidArgumentError, match="string"):
        Credentials(b"alice", "pw")  # type: ignore[arg-type]
    config = ClientConfiguration(
        "b:1", Credentials("alice", "s3cret-sk"), kafka={"ssl.key.password": "s3cret-key"}
    )
    for shown in (repr(config), str(config), repr(config.credentials)):
        assert "s3cret" not in shown
    assert "alice" in repr(config)
    assert "s3cret" not in repr(config.to_client_config())


def test_kafka_is_keyword_only_none_is_none_and_what_a_client_config_owns_is_refused() -> None:
    assert dict(ClientConfiguration("b:1", kafka=None).kafka) == {}
    assert ClientConfiguration("b:1", kafka=None) == ClientConfiguration("b:1")
    with pytest.raises(TypeError):
        ClientConfiguration("b:1", None, "", 3, {})  # type: ignore[call-arg]
    # A property a ClientConfig sets from a field of its own is refused, naming the field.
    with pytest.raises(InvalidArgumentError, match="linger_ms"):
        ClientConfiguration("b:1", kafka={"linger.ms": 5})
    with pytest.raises(InvalidArgumentError, match="kafka must be a mapping"):
        ClientConfiguration("b:1", kafka=[("linger.ms", 5)])  # type: ignore[arg-type]


def test_equal_configurations_hash_equal() -> None:
    one = ClientConfiguration("b:1", Credentials("a", "p"), "ns", 3, kafka={"client.rack": "r1"})
    same = ClientConfiguration("b:1", Credentials("a", "p"), "ns", 3.0, kafka={"client.rack": "r1"})
    other = ClientConfiguration("b:1", Credentials("a", "p"), "ns", 3, kafka={"client.rack": "r2"})
    assert one == same and hash(one) == hash(same)
    assert one != other
    assert {one: "cached"}[same] == "cached"


def test_tls_enable_is_taken_in_its_place_and_said_to_be_a_kafka_setting() -> None:
    plain = ClientConfiguration(UNREACHABLE, namespace="unit")
    tls = ClientConfiguration(UNREACHABLE, None, "unit", kafka={"security.protocol": "ssl"})
    login = ClientConfiguration(UNREACHABLE, Credentials("a", "p"), "unit")  # SASL_SSL
    checker = _Checker(TransactionResolution.COMMIT)
    refusals = (
        lambda: Producer(plain, ("orders",), checker, True),
        lambda: Producer(plain, tls_enable=True),
        lambda: SimpleConsumer(plain, "g", {"orders": "*"}, 20, True),
        lambda: AsyncSimpleConsumer(plain, "g", {"orders": "*"}, 20, True),
        lambda: PushConsumer(plain, "g", None, None, None, None, 20, True),
    )
    for make in refusals:
        with pytest.raises(InvalidArgumentError, match=r"TLS is a setting of the Kafka connection"):
            make()
    with pytest.raises(InvalidArgumentError, match="bool"):
        Producer(plain, tls_enable="yes")  # type: ignore[arg-type]
    # TLS on already (or not asked for): RocketMQ 5's call shapes work as they are.
    for config in (tls, login):
        assert Producer(config, ("orders",), checker, True).topics == ("orders",)
        assert SimpleConsumer(config, "g", {"orders": "*"}, 20, True).consumer_group == "g"
    assert Producer(plain, ("orders",), checker, False).topics == ("orders",)


def test_rocketmq_5s_cache_bounds_are_refused_in_their_places_and_thread_count_taken() -> None:
    config = _configuration()
    listener = _Listener(ConsumeResult.SUCCESS)
    for args, name in (
        ((1024,), "max_cache_message_count"),
        ((None, 64 << 20), "max_cache_message_size"),
    ):
        with pytest.raises(InvalidArgumentError, match=rf"{name}.*per partition") as refused:
            PushConsumer(config, "g", listener, {"orders": None}, *args)
        assert "pull_threshold" in str(refused.value)
    with pytest.raises(InvalidArgumentError, match="per partition"):
        PushConsumer(config, "g", listener, max_cache_message_count=1024)
    consumer = PushConsumer(config, "g", listener, {"orders": None}, None, None, 4)
    assert consumer._consumer.settings.consume_thread_count == 4


def test_every_client_takes_either_configuration() -> None:
    v5 = ClientConfiguration("b:9092", namespace="ns1")
    config = v5.to_client_config()
    assert as_client_config(v5, "x") is config and as_client_config(config, "x") is config
    assert as_client_config(None, "x") is None
    with pytest.raises(InvalidArgumentError, match="client_configuration must be"):
        SimpleConsumer({"endpoints": "b:9092"}, "g")  # type: ignore[arg-type]
    assert SimpleConsumer(v5, "g", {"t": "*"}).config == config
    assert AsyncSimpleConsumer(v5, "g").threaded.config == config  # the threaded one's
    assert Producer(v5).config == config
    assert PushConsumer(v5, "g").consumer_group == "g"
    for make in (lambda: Producer(None), lambda: PushConsumer(None, "g")):  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="client_configuration"):
            make()


# --- Message ----------------------------------------------------------------------------------
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zs")), min_size=1)
_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)


def _record_fields(msg: Message4) -> tuple[Any, ...]:
    """What a message's record is made of, but its id and birth (new on each send)."""
    record = Producer4("g", bootstrap_servers=UNREACHABLE).prepare(msg)
    own = {MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, MessageConst.BORN_HOST}
    headers = sorted((k, v) for k, v in record.headers if k not in own)
    return record.kafka_topic, record.key, record.value, headers


@given(
    tag=st.one_of(st.none(), _TEXT.filter(lambda t: "|" not in t and t.strip() != "")),
    keys=st.lists(_TEXT.filter(lambda k: " " not in k), max_size=3),
    properties=st.dictionaries(_NAMES, _TEXT, max_size=3),
    group=st.one_of(st.none(), st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True)),
    body=st.binary(min_size=1, max_size=32),
)
def test_a_v5_message_is_sent_as_the_record_its_4x_message_makes(
    tag: str | None, keys: list[str], properties: dict[str, str], group: str | None, body: bytes
) -> None:
    v5 = Message()
    v5.topic, v5.body = "orders", body
    if tag is not None:
        v5.tag = tag
    if keys:
        v5.keys = keys
    for name, value in properties.items():
        v5.add_property(name, value)
    v5.message_group = group
    four = Message4("orders", body, tags=tag, keys=keys, properties=properties, message_group=group)
    assert _record_fields(as_message(v5)) == _record_fields(four)
    assert (v5.topic, v5.body, v5.tag, v5.keys) == ("orders", body, tag, keys)
    assert (v5.properties, v5.message_group) == (properties, group)
    assert v5.message_id is None and v5.delivery_timestamp is None


@given(st.floats(1e-3, DELIVERY_TIMESTAMP_MAX_S, exclude_max=True) | st.integers(1, 10**10))
def test_delivery_timestamp_is_epoch_seconds_as_the_v5_client_sends_it(epoch_s: float) -> None:
    msg = Message("orders", b"x", delivery_timestamp=epoch_s)
    assert msg.delivery_timestamp == epoch_s
    due_ms = int(as_message(msg).get_property(MessageConst.TIMER_DELIVER_MS) or "")
    assert due_ms == math.ceil(epoch_s * 1000)  # never early
    msg.delivery_timestamp = None
    assert as_message(msg).get_property(MessageConst.TIMER_DELIVER_MS) is None


def test_a_message_set_by_keywords_equals_one_set_by_attributes() -> None:
    by_keywords = Message(
        "orders", "text body", tag="TagA", keys="k1", properties={"p": "v"}, message_group="g"
    )
    assert by_keywords.body == b"text body"
    by_attributes = Message()
    by_attributes.topic = "orders"
    by_attributes.body = b"text body"
    by_attributes.tag = "TagA"
    by_attributes.keys = "k1"
    by_attributes.add_property("p", "v")
    by_attributes.message_group = "g"
    assert as_message(by_keywords) == as_message(by_attributes)
    assert "TagA" in repr(by_keywords) and "9 bytes" in repr(by_keywords)
    by_attributes.tag = None
    by_attributes.message_group = None
    assert by_attributes.tag is None and as_message(by_attributes).kafka_key() == b"k1"


@pytest.mark.parametrize(
    ("attribute", "value", "error", "problem"),
    [
        ("topic", " ", InvalidMessageError, "topic must not be blank"),
        ("topic", 7, InvalidMessageError, "topic must be a string"),
        ("body", b"", InvalidMessageError, "body must not be empty"),
        ("body", 7, InvalidMessageError, "body must be bytes"),
        ("tag", "", InvalidMessageError, "tag must not be blank"),
        ("tag", "a|b", InvalidMessageError, "'|'"),
        ("keys", " ", InvalidMessageError, "a key must not be blank"),
        ("keys", ["ok", ""], InvalidMessageError, "non-empty"),
        ("message_group", " ", InvalidMessageError, "blank"),
        ("message_group", "x" * 64, InvalidMessageError, "64"),
        ("delivery_timestamp", 1_700_000_000_000, InvalidDelayError, "looks like milliseconds"),
        ("delivery_timestamp", True, InvalidDelayError, "epoch seconds"),
        ("delivery_timestamp", math.nan, InvalidDelayError, "epoch seconds"),
        ("delivery_timestamp", -5, InvalidDelayError, "epoch seconds"),
        ("delivery_timestamp", "soon", InvalidDelayError, "epoch seconds"),
    ],
)
def test_bad_attributes_are_refused_by_name(
    attribute: str, value: object, error: type[Exception], problem: str
) -> None:
    msg = Message("orders", b"x")
    with pytest.raises(error, match=problem):
        setattr(msg, attribute, value)


def test_properties_and_the_fifo_or_timed_rule_are_checked() -> None:
    msg = Message("orders", b"x")
    for name, value in (("", "v"), (" ", "v"), ("p", ""), ("p", " "), ("p", b"")):
        with pytest.raises(InvalidPropertyError, match="blank"):
            msg.add_property(name, value)
    with pytest.raises(InvalidPropertyError, match="KEYS"):
        msg.add_property(MessageConst.KEYS, "v")  # reserved
    msg.add_property("binary", b"\xff")
    assert msg.properties == {"binary": b"\xff"}
    timed = Message("orders", b"x", delivery_timestamp=2_000_000_000)
    with pytest.raises(InvalidMessageError, match="FIFO or timed"):
        timed.message_group = "g"
    fifo = Message("orders", b"x", message_group="g")
    with pytest.raises(InvalidMessageError, match="FIFO or timed"):
        fifo.delivery_timestamp = 2_000_000_000
    with pytest.raises(InvalidMessageError, match=r"bridge\.Producer"):
        as_message(Message4("orders", b"x"))


# --- transaction resolutions -----------------------------------------------------------------
def test_resolutions_map_as_rocketmq_5s_proxy_maps_them() -> None:
    assert transaction_status(TransactionResolution.COMMIT) is TransactionStatus.COMMIT
    assert transaction_status(TransactionResolution.ROLLBACK) is TransactionStatus.ROLLBACK
    for unknown in (
        TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED,
        TransactionResolution.UNKNOWN,
        None,
    ):
        assert transaction_status(unknown) is TransactionStatus.UNKNOWN
    # The v5 client's protobuf values are plain ints.
    assert [transaction_status(v) for v in (0, 1, 2)] == [
        TransactionStatus.UNKNOWN, TransactionStatus.COMMIT, TransactionStatus.ROLLBACK,
    ]  # fmt: skip
    assert TransactionResolution["UNKNOWN"] is TransactionResolution(0)


@given(
    st.one_of(
        st.integers(),
        st.booleans(),
        st.floats(),
        st.text(max_size=8),
        st.sampled_from(list(TransactionStatus)),
        st.sampled_from(list(ConsumeResult)),
    )
)
def test_only_a_resolution_is_an_answer(answer: object) -> None:
    status = transaction_status(answer)
    if type(answer) is int and 0 <= answer <= 2:
        assert status is not None
    else:
        assert status is None  # True is no COMMIT, 1.0 no resolution, "COMMIT" neither


class _Checker(TransactionChecker):
    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.seen: list[MessageView] = []

    def check(self, message: MessageView) -> TransactionResolution:
        self.seen.append(message)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[return-value]  # a wrong answer on purpose


def _half(body: bytes = b"order") -> MessageExt:
    return MessageExt(
        "orders",
        body,
        msg_id="tid-1",
        tags="TagA",
        properties={MessageConst.TRANSACTION_PREPARED: "true", "order": "42"},
    )


def test_the_checker_answers_check_backs_through_a_transaction_listener(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for answer, status in (
        (TransactionResolution.COMMIT, TransactionStatus.COMMIT),
        (TransactionResolution.ROLLBACK, TransactionStatus.ROLLBACK),
        (TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED, TransactionStatus.UNKNOWN),
        ("COMMIT", TransactionStatus.UNKNOWN),
        (TransactionStatus.COMMIT, TransactionStatus.UNKNOWN),
    ):
        checker = _Checker(answer)
        assert checker_listener(checker).check_local_transaction(_half()) is status
        (view,) = checker.seen
        assert (view.message_id, view.topic, view.body, view.tag) == (
            "tid-1", "orders", b"order", "TagA",
        )  # fmt: skip
        assert view.properties == {"order": "42"} and view.receipt_handle is None
    assert "answered 'COMMIT', not a TransactionResolution" in caplog.text
    # An exception goes to the producer, which counts it as UNKNOWN (and logs it).
    with pytest.raises(RuntimeError, match="db down"):
        checker_listener(_Checker(RuntimeError("db down"))).check_local_transaction(_half())
    with pytest.raises(InvalidArgumentError, match="TransactionChecker"):
        checker_listener(lambda message: TransactionResolution.COMMIT)


# --- the producer's front --------------------------------------------------------------------
def _configuration() -> ClientConfiguration:
    return ClientConfiguration(UNREACHABLE, namespace="unit")


def test_a_producer_checks_its_topics_checker_and_state_before_any_send() -> None:
    assert Producer(_configuration(), "orders").topics == ("orders",)
    assert Producer(_configuration(), ["a", "b", "a"]).topics == ("a", "b")
    assert Producer(_configuration(), None).topics == ()
    with pytest.raises(InvalidTopicNameError, match="system topic"):
        Producer(_configuration(), ("SCHEDULE_TOPIC_XXXX",))
    with pytest.raises(InvalidTopicNameError, match=r"\[a-zA-Z0-9._-\]"):
        Producer(_configuration(), ("orders!",))
    with pytest.raises(InvalidArgumentError, match="TransactionChecker"):
        Producer(_configuration(), ("orders",), checker=object())  # type: ignore[arg-type]
    producer = Producer(_configuration(), ("orders",), _Checker(TransactionResolution.COMMIT))
    for call in (
        lambda: producer.send(Message("orders", b"x")),
        lambda: producer.send_async(Message("orders", b"x")),
        producer.begin_transaction,
    ):
        with pytest.raises(IllegalStateError, match="startup"):
            call()
    with pytest.raises(InvalidMessageError, match=r"bridge\.Producer"):
        producer.send(Message4("orders", b"x"))  # type: ignore[arg-type]
    producer.shutdown()  # never started: nothing to close
    producer.shutdown()
    with pytest.raises(IllegalStateError):
        producer.startup()


def test_a_transaction_whose_half_message_was_not_stored_cannot_be_decided() -> None:
    transaction = Transaction(lambda: None)
    assert transaction.message_id is None
    with pytest.raises(IllegalStateError, match="no message sent in it yet"):
        transaction.commit()
    never_started = TransactionMQProducer(
        "orders", checker_listener(_Checker(None)), config=_configuration().to_client_config()
    )
    with pytest.raises(IllegalStateError):
        transaction._send(never_started, Message4("orders", b"x"))
    for decide in (transaction.commit, transaction.rollback):
        with pytest.raises(IllegalStateError, match="half message was not stored"):
            decide()
    with pytest.raises(InvalidArgumentError, match="one message"):
        transaction._send(never_started, Message4("orders", b"y"))


C, R, U = TransactionStatus.COMMIT, TransactionStatus.ROLLBACK, TransactionStatus.UNKNOWN


class _StubTransactionProducer:
    """A :class:`TransactionMQProducer` as a :class:`Transaction` uses it: the half message is
    stored at once; ``end_transaction`` raises ``failures`` one by one, calls ``during_end``,
    then records the decision."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.decisions: list[TransactionStatus] = []
        self.during_end: Any = None

    def send_half_message(self, msg: Message4) -> HalfMessage:
        ext = MessageExt(
            msg.topic, msg.body, msg_id="tid-7", properties={MessageConst.PRODUCER_GROUP: "g"}
        )
        return HalfMessage("tid-7", msg.topic, 0, 41, ext)

    def end_transaction(self, half: HalfMessage, status: TransactionStatus) -> None:
        if self.during_end is not None:
            self.during_end()
        if self.failures:
            raise self.failures.pop(0)
        self.decisions.append(status)


def _sent(stub: _StubTransactionProducer, stored: Any = None) -> Transaction:
    transaction = Transaction(lambda: None, stored)
    transaction._send(stub, Message4("orders", b"x"))  # type: ignore[arg-type]  # duck-typed
    return transaction


@pytest.mark.parametrize(
    "unknown",
    [SendTimeoutError("no acknowledgement within 3000 ms"), BrokerUnreachableError("gone")],
)
def test_after_a_decision_whose_outcome_is_unknown_only_the_same_one_is_allowed(
    unknown: Exception,
) -> None:
    stub = _StubTransactionProducer(unknown)
    transaction = _sent(stub)
    with pytest.raises(type(unknown)):
        transaction.commit()
    with pytest.raises(IllegalStateError) as refused:
        transaction.rollback()
    assert f"a COMMIT of it was sent and its outcome is unknown ({type(unknown).__name__}" in str(
        refused.value
    )
    assert "may be stored" in str(refused.value) and "call commit() again" in str(refused.value)
    assert stub.decisions == []  # the refused rollback wrote nothing
    transaction.commit()
    assert stub.decisions == [C]
    assert "committed" in repr(transaction)


def test_after_a_decision_the_broker_refused_either_may_follow() -> None:
    stub = _StubTransactionProducer(SendError("record refused"), IllegalStateError("shut down"))
    transaction = _sent(stub)
    with pytest.raises(SendError):
        transaction.commit()
    with pytest.raises(IllegalStateError, match="shut down"):
        transaction.rollback()  # refused before anything was sent
    transaction.commit()
    assert stub.decisions == [C]


def test_a_check_answer_for_an_undecided_transaction_stands_against_the_opposite_decision() -> None:
    stub = _StubTransactionProducer()
    transaction = _sent(stub)
    assert transaction._check_answered(U) is U
    assert transaction._check_answered(R) is R
    with pytest.raises(IllegalStateError) as refused:
        transaction.commit()
    assert "the TransactionChecker answered ROLLBACK" in str(refused.value)
    assert "first decision it reads" in str(refused.value)
    assert stub.decisions == [] and "the checker answered ROLLBACK" in repr(transaction)
    transaction.rollback()  # the same decision: written again, harmlessly
    assert stub.decisions == [R]
    # Decided here: a later check is answered with the decision stored.
    assert transaction._check_answered(C) is R


def test_a_check_answered_while_a_decision_is_written_leaves_it_to_that_decision() -> None:
    stub = _StubTransactionProducer()
    transaction = _sent(stub)
    during: list[TransactionStatus] = []
    stub.during_end = lambda: during.append(transaction._check_answered(R))
    transaction.commit()
    assert during == [U] and stub.decisions == [C]
    # After a commit whose outcome is unknown, a check answering ROLLBACK makes both refuse.
    stub = _StubTransactionProducer(SendTimeoutError("no acknowledgement"))
    transaction = _sent(stub)
    with pytest.raises(SendTimeoutError):
        transaction.commit()
    assert transaction._check_answered(R) is R
    with pytest.raises(IllegalStateError, match=r"answered ROLLBACK.*outcome is unknown"):
        transaction.commit()
    with pytest.raises(IllegalStateError, match=r"a COMMIT of it .* outcome is unknown"):
        transaction.rollback()  # the COMMIT may be stored first: no rollback() reports success
    assert stub.decisions == []


def test_the_producer_tells_a_transaction_it_sent_what_its_checker_answered() -> None:
    checker = _Checker(TransactionResolution.ROLLBACK)
    producer = Producer(_configuration(), ("orders",), checker)
    listener = producer._transactional["orders"].listener
    assert listener is not None
    stub = _StubTransactionProducer()
    transaction = _sent(stub, producer._stored)
    half = _half()
    half.msg_id = "tid-7"
    assert listener.check_local_transaction(half) is R
    with pytest.raises(IllegalStateError, match="answered ROLLBACK"):
        transaction.commit()
    # The producer holds its transactions weakly: one nobody holds is forgotten.
    del transaction
    gc.collect()
    assert producer._check_answered("tid-7", C) is C


class _BlockingChecker(TransactionChecker):
    """Commits; a message with the body ``hangs`` is answered once ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.calls = 0
        self.running = 0
        self.most = 0
        """The most calls that ran at once."""

    def check(self, message: MessageView) -> TransactionResolution:
        with self.lock:
            self.calls += 1
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if message.body == b"hangs":
                self.release.wait(30)
            return TransactionResolution.COMMIT
        finally:
            with self.lock:
                self.running -= 1


def test_the_checker_is_called_one_check_at_a_time_and_a_check_waits_for_it_boundedly() -> None:
    checker = _BlockingChecker()
    listener = checker_listener(checker, wait_s=0.2)
    hung = threading.Thread(target=listener.check_local_transaction, args=(_half(b"hangs"),))
    hung.start()
    try:
        wait_until(lambda: checker.calls == 1, timeout_s=10)
        # Another topic's check thread: it waits for the call running, then gives up.
        assert listener.check_local_transaction(_half(b"next")) is U
        assert checker.calls == 1
    finally:
        checker.release.set()
        hung.join(10)
    assert listener.check_local_transaction(_half(b"next")) is C
    assert checker.most == 1
    # A producer's topics share one listener, so one lock.
    producer = Producer(_configuration(), ("a", "b"), checker)
    assert producer._transactional["a"].listener is producer._transactional["b"].listener


class _StubClient:
    """An inner client whose shutdown returns once ``barrier`` is passed by all."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier
        self.timeouts: list[int | None] = []

    def shutdown(self, timeout_ms: int | None = None) -> None:
        self.timeouts.append(timeout_ms)
        self.barrier.wait()


def test_shutdown_stops_the_inner_clients_side_by_side() -> None:
    producer = Producer(_configuration(), ("a", "b"), _Checker(TransactionResolution.COMMIT))
    barrier = threading.Barrier(3, timeout=10)  # one after the other: broken after 10 s
    plain, first, second = (_StubClient(barrier) for _ in range(3))
    producer._producer = plain  # type: ignore[assignment]
    producer._transactional = {"a": first, "b": second}  # type: ignore[dict-item]
    producer.shutdown(500)
    assert [c.timeouts for c in (plain, first, second)] == [[500], [500], [500]]
    producer.shutdown(500)  # idempotent
    assert plain.timeouts == [500]
    with pytest.raises(InvalidArgumentError, match="timeout_ms"):
        Producer(_configuration()).shutdown(-1)


def test_the_producer_runs_only_once_its_inner_clients_started() -> None:
    producer = Producer(_configuration(), ("orders",))
    started, go_on = threading.Event(), threading.Event()

    class SlowStart:
        def start(self) -> None:
            started.set()
            go_on.wait(10)

        def shutdown(self, timeout_ms: int | None = None) -> None:
            pass

        def send_sync(self, msg: Message4) -> None:
            raise AssertionError("sent through a producer still starting")

    producer._producer = SlowStart()  # type: ignore[assignment]
    starting = threading.Thread(target=producer.startup)
    starting.start()
    try:
        assert started.wait(10)
        with pytest.raises(IllegalStateError, match="CREATE_JUST, not RUNNING: call startup"):
            producer.send(Message("orders", b"x"))
        assert not producer.is_running
    finally:
        go_on.set()
        starting.join(10)
    assert producer.is_running
    producer.shutdown()
    assert not producer.is_running


def test_a_topic_that_cannot_be_a_producer_group_is_refused_with_a_checker_saying_why() -> None:
    checker = _Checker(TransactionResolution.COMMIT)
    long = "t" * 240  # a topic may have 249 characters, a group 200
    for topic, rule in (
        (long, "at most 200"),
        ("a.broadcast.b", "'.broadcast.' is reserved"),
        ("a.transaction-check.b", "'.transaction-check.'"),
    ):
        assert Producer(_configuration(), (topic,)).topics == (topic,)  # plain sends: a topic
        with pytest.raises(InvalidTopicNameError) as refused:
            Producer(_configuration(), ("orders", topic), checker)
        assert refused.value.name == topic
        assert "producer group of its transactions" in str(refused.value)
        assert rule in str(refused.value)


def test_end_transaction_refuses_what_is_not_a_half_message_of_its_group() -> None:
    config = _configuration().to_client_config()
    producer = TransactionMQProducer("orders_tx", checker_listener(_Checker(None)), config=config)

    def half(group: str) -> HalfMessage:
        msg = MessageExt(
            "orders", b"x", msg_id="tid-9", properties={MessageConst.PRODUCER_GROUP: group}
        )
        return HalfMessage("tid-9", "orders", 0, 3, msg)

    with pytest.raises(InvalidArgumentError, match="TransactionStatus"):
        producer.end_transaction(half("orders_tx"), "COMMIT")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="HalfMessage"):
        producer.end_transaction(object(), C)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError) as other:
        producer.end_transaction(half("payments_tx"), C)
    assert "'payments_tx'" in str(other.value) and "'orders_tx'" in str(other.value)
    for call in (
        lambda: producer.end_transaction(half("orders_tx"), C),
        lambda: producer.send_half_message(Message4("orders", b"x")),
    ):
        with pytest.raises(IllegalStateError, match="not RUNNING"):
            call()  # never started


# --- the push consumer's front ---------------------------------------------------------------
class _Listener(MessageListener):
    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.seen: list[MessageView] = []

    def consume(self, message: MessageView) -> ConsumeResult:
        self.seen.append(message)
        return self.answer  # type: ignore[return-value]  # a wrong answer on purpose


@given(st.one_of(st.sampled_from(list(ConsumeResult)), st.none(), st.booleans(), st.integers()))
def test_only_success_consumes_a_message(result: object) -> None:
    expected = (
        ConsumeStatus.CONSUME_SUCCESS
        if result is ConsumeResult.SUCCESS
        else ConsumeStatus.RECONSUME_LATER
    )
    assert consume_status(result) is expected


def test_the_listener_gets_each_message_as_a_view(caplog: pytest.LogCaptureFixture) -> None:
    msg = MessageExt(
        "orders", b"x", msg_id="m1", properties={MessageConst.RECONSUME_TIME: "2", "p": "v"}
    )
    listener = _Listener(ConsumeResult.SUCCESS)
    consumer = PushConsumer(_configuration(), "g", listener, {"orders": None})
    assert consumer._consume(msg) is ConsumeStatus.CONSUME_SUCCESS
    (view,) = listener.seen
    assert (view.message_id, view.delivery_attempt, view.properties) == ("m1", 3, {"p": "v"})
    assert view.message is msg
    listener.answer = None
    with caplog.at_level(logging.ERROR):
        assert consumer._consume(msg) is ConsumeStatus.RECONSUME_LATER
    assert "answered None for m1, not a ConsumeResult: a failure" in caplog.text


def test_a_push_consumer_checks_its_listener_and_subscriptions_before_startup() -> None:
    with pytest.raises(InvalidArgumentError, match="MessageListener"):
        PushConsumer(_configuration(), "g", lambda m: ConsumeResult.SUCCESS)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="consumer_group"):
        PushConsumer(_configuration(), " ")
    with pytest.raises(FilterExpressionError) as invalid:
        PushConsumer(
            _configuration(),
            "g",
            subscription={"orders": FilterExpression("a >", FilterType.SQL)},
        )
    assert invalid.value.position == 3
    consumer = PushConsumer(_configuration(), "g", subscription={"orders": "TagA || TagB"})
    with pytest.raises(IllegalStateError, match="no message_listener"):
        consumer.startup()
    consumer = PushConsumer(_configuration(), "g", _Listener(ConsumeResult.SUCCESS))
    with pytest.raises(IllegalStateError, match="no subscription"):
        consumer.startup()
    consumer.subscribe("orders")
    consumer.subscribe("payments", FilterExpression("amount > 100", FilterType.SQL92))
    consumer.unsubscribe("orders")
    consumer.unsubscribe("unknown")
    assert list(consumer.subscription) == ["payments"]
    with pytest.raises(InvalidArgumentError, match="consume_thread_count"):
        PushConsumer(_configuration(), "g", consumption_thread_count=0)
    with pytest.raises(InvalidArgumentError, match="unknown push consumer setting"):
        PushConsumer(_configuration(), "g", max_cached_messages=1024)
    consumer.shutdown()
    with pytest.raises(IllegalStateError, match="before startup"):
        consumer.subscribe("orders")
