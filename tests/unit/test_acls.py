"""The trust model's ACL table: who needs what, least privilege."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bridge.cli import cli
from bridge.errors import InvalidArgumentError
from topics.acls import (
    Acl,
    Deployment,
    Operation,
    PatternType,
    ResourceType,
    acls_for,
    principal,
    topic_resource,
)

EVERYONE = Deployment(
    namespace="prod",
    topics=("orders", "audit-*"),
    producer="app",
    transactional_producers={"pay_tx": "User:payments"},
    coordinator="coord",
    consumers={"ship_cg": "shipping"},
    spark="spark",
    operator="ops",
)


def grants(who: str, deployment: Deployment = EVERYONE) -> set[tuple[str, str, str, str]]:
    return {
        (a.resource_type.value, a.name, a.pattern.value, a.operation.value)
        for a in acls_for(deployment)
        if a.principal == who
    }


def test_a_producer_writes_the_real_topics_and_the_delay_topics_only() -> None:
    assert grants("User:app") == {
        ("TOPIC", "orders", "LITERAL", "WRITE"),
        ("TOPIC", "audit-", "PREFIXED", "WRITE"),
        ("TOPIC", "prod.SCHEDULE_TOPIC_XXXX", "LITERAL", "WRITE"),
        ("TOPIC", "prod.SCHEDULE_TOPIC_XXXX", "LITERAL", "DESCRIBE_CONFIGS"),
        ("TOPIC", "prod.rmq_sys_wheel_timer", "LITERAL", "WRITE"),
        ("TOPIC", "prod.rmq_sys_wheel_timer", "LITERAL", "DESCRIBE_CONFIGS"),
        ("TOPIC", "prod.rmq_sys_timer_recall", "LITERAL", "WRITE"),
        ("TOPIC", "prod.rmq_sys_timer_recall", "LITERAL", "DESCRIBE_CONFIGS"),
        ("TOPIC", "prod.RMQ_SYS_TRANS_HALF_TOPIC", "LITERAL", "DESCRIBE"),
        ("TOPIC", "prod.RMQ_SYS_TRANS_HALF_TOPIC", "LITERAL", "DESCRIBE_CONFIGS"),
        ("TOPIC", "prod.RMQ_SYS_TRANS_OP_HALF_TOPIC", "LITERAL", "DESCRIBE"),
        ("TOPIC", "prod.RMQ_SYS_TRANS_OP_HALF_TOPIC", "LITERAL", "DESCRIBE_CONFIGS"),
    }


def test_a_transactional_producer_gets_its_own_groups_check_topic_only() -> None:
    got = grants("User:payments")
    assert ("TOPIC", "prod.RMQ_SYS_TRANS_HALF_TOPIC", "LITERAL", "WRITE") in got
    # WRITE implies DESCRIBE: the producer rule's DESCRIBE on HALF is left out.
    assert ("TOPIC", "prod.RMQ_SYS_TRANS_HALF_TOPIC", "LITERAL", "DESCRIBE") not in got
    assert ("TOPIC", "prod.CHECK.pay__tx", "LITERAL", "READ") in got
    assert ("GROUP", "prod.transaction-check.pay_tx", "LITERAL", "READ") in got
    # Never the OP topic's WRITE (decisions are the coordinator's), nor another group's checks.
    assert not any(op == "WRITE" and "OP_HALF" in name for _, name, _, op in got)
    assert not any(
        name.startswith("prod.CHECK.") and name != "prod.CHECK.pay__tx" for _, name, _, _ in got
    )


def test_only_the_coordinator_writes_decisions_and_uses_its_transactional_ids() -> None:
    writers_of_op = {
        a.principal
        for a in acls_for(EVERYONE)
        if a.name == "prod.RMQ_SYS_TRANS_OP_HALF_TOPIC" and a.operation is Operation.WRITE
    }
    assert writers_of_op == {"User:coord"}  # and the operator, through the prefix prod.
    coord = grants("User:coord")
    assert ("TRANSACTIONAL_ID", "prod.coordinator.", "PREFIXED", "WRITE") in coord
    for kind in ("transaction", "schedule", "timer"):
        assert ("GROUP", f"prod.coordinator.{kind}", "LITERAL", "READ") in coord


def test_a_consumer_reads_its_own_group_and_writes_its_own_dlq() -> None:
    got = grants("User:shipping")
    assert ("GROUP", "ship_cg", "LITERAL", "READ") in got
    assert ("TOPIC", "orders", "LITERAL", "READ") in got
    assert ("TOPIC", "prod.RETRY.ship__cg", "LITERAL", "READ") in got
    assert ("TOPIC", "prod.DLQ.ship__cg", "LITERAL", "WRITE") in got
    assert not any(op == "WRITE" and name in ("orders", "audit-") for _, name, _, op in got)


def test_no_role_gets_all_delete_alter_or_a_wildcard_it_was_not_given() -> None:
    for acl in acls_for(EVERYONE):
        assert acl.operation.value not in ("ALL", "DELETE", "ALTER", "ALTER_CONFIGS")
        assert acl.name != "*"
    only = Deployment(namespace="prod", topics=("*",), producer="app")
    assert ("TOPIC", "*", "LITERAL", "WRITE") in grants("User:app", only)


def test_acls_are_sorted_and_unique() -> None:
    both = Deployment(namespace="prod", topics=("orders",), producer="x", consumers={"g": "x"})
    acls = acls_for(both)
    keys = [a.key for a in acls]
    assert len(keys) == len(set(keys))
    assert isinstance(acls[0], Acl)


@pytest.mark.parametrize("bad", ["", "a\tb", "User:"])
def test_bad_principals_are_refused(bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        principal(bad)


def test_topic_patterns() -> None:
    assert topic_resource("orders") == ("orders", PatternType.LITERAL)
    assert topic_resource("orders-*") == ("orders-", PatternType.PREFIXED)
    assert topic_resource("*") == ("*", PatternType.LITERAL)
    with pytest.raises(InvalidArgumentError):
        topic_resource("a*b*")
    with pytest.raises(InvalidArgumentError):
        Deployment(namespace="bad_ns", producer="x")


def test_bridge_acls_print_as_json_lines() -> None:
    out = CliRunner().invoke(
        cli,
        ["--namespace", "prod", "acls", "print", "--json", "--topic", "orders",
         "--consumer", "ship_cg=shipping", "--spark", "spark"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert {r["principal"] for r in rows} == {"User:shipping", "User:spark"}
    assert all(r["permission"] == "ALLOW" and r["host"] == "*" for r in rows)
    spark_group = [
        r for r in rows if r["principal"] == "User:spark" and r["resource_type"] == "GROUP"
    ]
    assert spark_group[0]["pattern_type"] == "PREFIXED"
    assert ResourceType.GROUP.value == "GROUP"


def test_bridge_acls_print_without_a_principal_is_an_error() -> None:
    out = CliRunner().invoke(cli, ["acls", "print", "--topic", "orders"])
    assert out.exit_code == 1
    assert "no principal given" in out.output


@pytest.mark.parametrize("wild", ["*", "User:*", "svc*", "User:ad*min"])
def test_a_wildcard_principal_is_refused_naming_the_role(wild: str) -> None:
    with pytest.raises(InvalidArgumentError, match="every user") as err:
        Deployment(namespace="prod", topics=("orders",), consumers={"ship_cg": wild})
    assert "consumer of ship_cg" in str(err.value)
    with pytest.raises(InvalidArgumentError, match="operator"):
        Deployment(namespace="prod", operator=wild)
    with pytest.raises(InvalidArgumentError):
        principal(wild)


def test_a_distinguished_name_with_inner_blanks_is_a_principal() -> None:
    assert principal("User:CN=svc,O=Acme Inc") == "User:CN=svc,O=Acme Inc"
    assert principal("CN=svc,O=Acme Inc") == "User:CN=svc,O=Acme Inc"
    acls = acls_for(Deployment(namespace="prod", topics=("orders",), producer="CN=svc,O=Acme Inc"))
    assert {a.principal for a in acls} == {"User:CN=svc,O=Acme Inc"}


@pytest.mark.parametrize("bad", [" ", " alice", "alice ", "User: alice", "User:alice ", ":x"])
def test_empty_names_and_outer_blanks_are_refused(bad: str) -> None:
    with pytest.raises(InvalidArgumentError, match="leading or trailing blanks"):
        principal(bad)


def test_bridge_acls_print_refuses_a_wildcard_principal() -> None:
    out = CliRunner().invoke(
        cli, ["--namespace", "prod", "acls", "print", "--topic", "orders", "--spark", "User:*"]
    )
    assert out.exit_code == 1
    assert "spark role" in out.output and "every user" in out.output
