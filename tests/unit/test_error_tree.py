"""One error tree: every error class of ``bridge``, ``topics`` and ``spark_jobs`` derives from
``BridgeError``, is defined in ``bridge.errors`` or ``topics.errors`` (or named in the tree
of ``bridge.errors``' docstring with where it lives), and says whether it is worth retrying
with a bool ``retriable``, which the retry paths read: the consumers' send-back and
quarantine copies (:func:`refused_for_good`), the delay and transaction services'
(:func:`is_permanent_delivery_error`), the transaction service's recovery and the
coordinator's renewal of a service."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import given, settings
from hypothesis import strategies as st

import bridge
import spark_jobs
import topics
from bridge import errors
from bridge.consumer.quarantine import refused_for_good
from bridge.kafka.clients import translate_error
from bridge.kafka.transactional import is_permanent_delivery_error
from topics.errors import BridgeError

OUTSIDE_THE_TREE = {
    "bridge.cli.output.NotFoundError": "a click exception: the command line's exit status 4",
    "bridge.cli.output.UnreachableError": "a click exception: the command line's exit status 3",
    "bridge.consumer.sql92.values.EvaluationError": "internal: an SQL92 value is unknown",
    "bridge.cli.console.paging.CursorError": "internal: a page's cursor that does not parse (400)",
    "bridge.cli.console.security.WriteRefused": "internal: a console write refused (403)",
    "bridge.cli.console.security.DryRunRefused": "internal: a replay without its dry run (409)",
    "bridge.cli.console.decoding.BodyDecodeError": "internal: a body shown undecoded, with why",
    "bridge.cli.console.decoding.DeserializerSpecError": "internal: --deserializer's usage error",
}
DEFINED_ELSEWHERE = {"bridge.consumer.admin.DeadLetterReplayError"}
"""Named in the tree, defined beside what it reports on (its attributes hold its messages)."""


def _modules() -> Iterator[str]:
    for package in (topics, bridge, spark_jobs):
        yield package.__name__
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name != "bridge.__main__":  # runs the command line
                yield info.name


def _error_classes() -> dict[str, type[BaseException]]:
    found = {}
    for name in _modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == name:
                found[f"{name}.{cls.__qualname__}"] = cls
    return found


ERRORS = _error_classes()
TREE = dict(
    re.findall(r"^    (?:[| ]*\+-- )?(\w+Error)(?: (\[[rk]\]))?", errors.__doc__ or "", re.M)
)
"""Class name -> its mark in the tree of ``bridge.errors``' docstring (``[r]``, ``[k]``, "")."""


def test_every_error_is_in_the_tree_and_defined_in_an_errors_module() -> None:
    assert len(ERRORS) > 40
    outside = {name for name, cls in ERRORS.items() if not issubclass(cls, BridgeError)}
    assert outside == set(OUTSIDE_THE_TREE)
    elsewhere = {
        name
        for name, cls in ERRORS.items()
        if issubclass(cls, BridgeError) and cls.__module__ not in ("bridge.errors", "topics.errors")
    }
    assert elsewhere == DEFINED_ELSEWHERE


@pytest.mark.parametrize(
    "cls", [c for n, c in ERRORS.items() if n not in OUTSIDE_THE_TREE], ids=lambda c: c.__name__
)
def test_every_error_says_whether_it_is_worth_retrying_and_is_documented(
    cls: type[BridgeError],
) -> None:
    assert type(cls.retriable) is bool
    assert cls.__name__ in TREE, f"{cls.__name__} is missing from the documented tree"
    assert (TREE[cls.__name__] == "[r]") is cls.retriable, "[r] marks the retriable ones"
    if TREE[cls.__name__] == "[k]":
        assert issubclass(cls, errors.KafkaClientError) and cls.by_kafka_error
    if issubclass(cls, errors.KafkaClientError) and cls.by_kafka_error:
        marked = [c for c in cls.__mro__ if TREE.get(c.__name__) == "[k]"]
        assert marked, f"{cls.__name__} takes retriable from librdkafka's error: mark it [k]"
    if cls.__module__ in ("bridge.errors", "topics.errors"):
        assert cls.__name__ in errors.__all__
        assert getattr(errors, cls.__name__) is cls


def test_old_import_paths_still_work() -> None:
    from bridge.kafka.quarantine import NotReplayableError
    from bridge.kafka.service import DuplicateCoordinatorError, MembershipLostError
    from bridge.lifecycle import FatalServiceError
    from bridge.runtime.cluster import ClusterUnhealthyError
    from spark_jobs.common import TopicNotFoundError
    from topics.client_security import ClientPropertyError

    assert (NotReplayableError, DuplicateCoordinatorError, MembershipLostError) == (
        errors.NotReplayableError,
        errors.DuplicateCoordinatorError,
        errors.MembershipLostError,
    )
    assert (FatalServiceError, ClusterUnhealthyError) == (
        errors.FatalServiceError,
        errors.ClusterUnhealthyError,
    )
    assert (TopicNotFoundError, ClientPropertyError) == (
        errors.TopicNotFoundError,
        errors.ClientPropertyError,
    )


RETRIABLE = {
    "BrokerUnreachableError",
    "DeserializationError",
    "MembershipLostError",
    "SendTimeoutError",
}


def test_the_classes_worth_retrying() -> None:
    worth = {
        cls.__name__ for cls in ERRORS.values() if issubclass(cls, BridgeError) and cls.retriable
    }
    assert worth == RETRIABLE


# --- the classification the retry paths read ------------------------------------------------
ME = KafkaError
CASES: list[tuple[str, BaseException, bool, bool]] = [
    # (case, error, retriable, refused for good: a consumer's copy is quarantined)
    ("too large", errors.SendError("x", ME(ME.MSG_SIZE_TOO_LARGE)), False, True),
    ("topic ACL", errors.SendError("x", ME(ME.TOPIC_AUTHORIZATION_FAILED)), False, True),
    ("unknown topic", errors.SendError("x", ME(ME.UNKNOWN_TOPIC_OR_PART)), False, True),
    ("report timeout", errors.SendError("x", ME(ME._MSG_TIMED_OUT)), True, False),
    ("purged", errors.SendError("x", ME(ME._PURGE_QUEUE)), True, False),
    ("fenced", errors.SendError("x", ME(ME.PRODUCER_FENCED)), True, False),
    ("local error", errors.SendError("x", ME(ME._BAD_MSG)), True, False),
    ("send timeout", errors.SendTimeoutError("no acknowledgement"), True, False),
    ("unreachable", errors.BrokerUnreachableError("x", ME(ME._TRANSPORT)), True, False),
    ("too large (client)", errors.MessageTooLargeError(2 << 20, 1 << 20), False, True),
    ("bad argument", errors.InvalidArgumentError("x"), False, True),
    ("not started", errors.IllegalStateError("not started"), False, False),
    ("no leader", errors.KafkaClientError("x", ME(ME.NOT_LEADER_FOR_PARTITION)), True, False),
    ("call timeout", errors.KafkaClientError("x", ME(ME._TIMED_OUT)), True, False),
    ("no error code", errors.KafkaClientError("x"), False, False),
    ("group ACL", errors.AuthorizationError("x", ME(ME.GROUP_AUTHORIZATION_FAILED)), False, False),
    ("deserializer", errors.DeserializationError("x", "t", "value"), True, False),
    ("membership", errors.MembershipLostError("x"), True, False),
    ("duplicate", errors.DuplicateCoordinatorError("x"), False, False),
    ("malformed", errors.MalformedRecordError("x"), False, False),
    ("a bug", RuntimeError("the client broke"), False, False),
]


@pytest.mark.parametrize(
    ("error", "retriable", "refused"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_what_the_retry_paths_read(error: BaseException, retriable: bool, refused: bool) -> None:
    assert getattr(error, "retriable", False) is retriable
    assert refused_for_good(error) is refused


CODES = sorted(
    {
        value
        for name, value in vars(KafkaError).items()
        if type(value) is int and (name.isupper() or name.startswith("_")) and name != "__doc__"
    }
)


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(code=st.sampled_from(CODES), fatal=st.booleans(), flagged=st.booleans())
def test_a_kafka_error_is_classified_once_whichever_way_it_comes(
    code: int, fatal: bool, flagged: bool
) -> None:
    err = KafkaError(code, "x", fatal=fatal, retriable=flagged)
    sent = errors.SendError("send", err)
    # A record's delivery: the services' rule and the consumer's read the same attribute.
    assert is_permanent_delivery_error(err) is (not sent.retriable)
    assert refused_for_good(err) is refused_for_good(KafkaException(err)) is (not sent.retriable)
    assert refused_for_good(translate_error(err, "send")) is refused_for_good(sent)
    # A fatal error ends the producer, not the record; a plain call fails for good.
    call = errors.KafkaClientError("call", err)
    if fatal:
        assert sent.retriable is (code not in REFUSED) and not call.retriable
    # Classes whose condition decides, whatever librdkafka said.
    assert errors.SendTimeoutError("t", err).retriable
    assert errors.BrokerUnreachableError("u", err).retriable
    assert not errors.AuthorizationError("a", err).retriable
    # Given explicitly, it wins.
    assert errors.SendError("s", err, retriable=False).retriable is False


REFUSED = errors._REFUSED_RECORD
"""What Kafka refuses a record for (the cases above pin examples of it)."""


def test_the_coordinator_renews_a_service_whose_error_is_retriable() -> None:
    # MembershipLostError is the one retriable FatalServiceError: the coordinator runs a
    # fresh service for it (see Coordinator._service_failed) and stops for the others.
    fatal = [
        cls
        for cls in ERRORS.values()
        if issubclass(cls, errors.FatalServiceError) and cls.retriable
    ]
    assert fatal == [errors.MembershipLostError]
