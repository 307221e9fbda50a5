"""bridge.db's pure rules: which key names a message, what a log row answers, the printed DDL,
and the arguments refused with a typed error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import create_engine

from bridge.cli import cli
from bridge.db import DatabaseTransactionListener, IdempotentListener, ddl, message_key, purge
from bridge.db.rows import consumed_row, state_of
from bridge.errors import InvalidArgumentError
from bridge.message import MessageConst, MessageExt
from bridge.transaction.model import TransactionStatus


def test_the_default_key_is_the_first_message_id() -> None:
    assert message_key(MessageExt("t", b"x", msg_id="M1")) == "M1"
    retry = MessageExt(
        "%RETRY%g", b"x", msg_id="M2", properties={MessageConst.ORIGIN_MESSAGE_ID: "M1"}
    )
    assert message_key(retry) == "M1"


@given(st.one_of(st.none(), st.text(max_size=20)))
def test_only_commit_and_rollback_rows_decide(found: str | None) -> None:
    expected = {"COMMIT": TransactionStatus.COMMIT, "ROLLBACK": TransactionStatus.ROLLBACK}
    assert state_of(found) is expected.get(found or "", TransactionStatus.UNKNOWN)


@pytest.mark.parametrize("key", ["", "k" * 256, None, 7])
def test_a_bad_key_is_refused_by_name(key: object) -> None:
    with pytest.raises(InvalidArgumentError, match="key must be"):
        consumed_row(MessageExt("t", b"x", msg_id="M"), "g", key)  # type: ignore[arg-type]


def test_ddl_for_both_dialects_has_both_tables_and_their_indexes() -> None:
    for dialect in ("postgresql", "sqlite"):
        text = ddl(dialect)
        assert text.count("CREATE TABLE") == 2 and text.count("CREATE INDEX") == 2
        assert "PRIMARY KEY (transaction_id)" in text
        assert "PRIMARY KEY (consumer_group, message_key)" in text
        assert all(line == line.rstrip() for line in text.splitlines())
    with pytest.raises(InvalidArgumentError, match="unknown dialect"):
        ddl("oracle")
    printed = CliRunner().invoke(cli, ["db", "ddl", "--dialect", "sqlite"])
    assert printed.exit_code == 0 and printed.output == ddl("sqlite")


def test_bad_arguments_get_typed_errors(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path}/db.sqlite")
    with pytest.raises(InvalidArgumentError, match="Engine"):
        DatabaseTransactionListener("sqlite://")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="check_lock_timeout_ms"):
        DatabaseTransactionListener(engine, check_lock_timeout_ms=0)
    with pytest.raises(InvalidArgumentError, match="consumer_group"):
        IdempotentListener(engine, "", lambda conn, msg: None)
    with pytest.raises(InvalidArgumentError, match="callable"):
        DatabaseTransactionListener(engine).execute_local_transaction(
            MessageExt("t", b"x", msg_id="M"), "not work"
        )
    with pytest.raises(InvalidArgumentError, match="transaction_retention_ms"):
        purge(engine, transaction_retention_ms=-1)
    # Hours given as ms, say: every log row older than 72 ms would go, and a check of a
    # committed transaction whose END was lost would then fence it as rolled back.
    with pytest.raises(InvalidArgumentError, match="transaction_retention_ms"):
        purge(engine, transaction_retention_ms=72)


def test_purge_refuses_a_transaction_retention_under_the_check_window() -> None:
    refused = CliRunner().invoke(
        cli, ["db", "purge", "sqlite://", "--transaction-retention-hours", "1"]
    )
    assert refused.exit_code == 2 and "72" in refused.output


@given(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=300))
def test_a_long_default_key_is_digested_not_cut_nor_refused(a: str, b: str) -> None:
    # Another Kafka client's record on a long topic name has the id topic-partition-offset,
    # longer than the key column: cut, two records would share a key (one skipped); refused,
    # every one of them would be dead-lettered.
    long_a, long_b = "t" * 249 + "-0-" + a, "t" * 249 + "-0-" + b
    key_a = message_key(MessageExt("t", b"x", msg_id=long_a))
    key_b = message_key(MessageExt("t", b"x", msg_id=long_b))
    assert 0 < len(key_a) <= 255
    consumed_row(MessageExt("t", b"x", msg_id=long_a), "g", key_a)  # taken by the table
    assert (key_a == key_b) is (a == b)


def test_a_database_that_cannot_be_used_is_named_not_a_traceback(tmp_path: Path) -> None:
    runner = CliRunner()
    missing_dir = f"sqlite:///{tmp_path}/no/such/dir/x.db"
    refused = runner.invoke(cli, ["db", "init", missing_dir])
    assert refused.exit_code == 1 and isinstance(refused.exception, SystemExit), refused.output
    assert "unable to open database file" in refused.output
    no_tables = runner.invoke(cli, ["db", "purge", f"sqlite:///{tmp_path}/empty.db"])
    assert no_tables.exit_code == 1 and isinstance(no_tables.exception, SystemExit)
    assert "bridge_transaction_log" in no_tables.output  # no such table, by name


def test_importing_bridge_db_without_the_extra_names_it() -> None:
    # SQLAlchemy is the db extra's: without it, the error says what to install.
    code = (
        "import sys; sys.modules['sqlalchemy'] = None\n"
        "try:\n    import bridge.db\n"
        "except ModuleNotFoundError as exc:\n    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "pip install 'rocketmq-kafka-bridge[db]'" in out


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_sqlite_database_is_refused(url: str) -> None:
    # Each connection has its own: the check thread would never see the local transaction's row.
    engine = create_engine(url)
    with pytest.raises(InvalidArgumentError, match="in-memory"):
        DatabaseTransactionListener(engine)
    with pytest.raises(InvalidArgumentError, match="in-memory"):
        IdempotentListener(engine, "g", lambda conn, msg: None)
