"""Every setting, environment variable and metric describes itself: the documentation's
reference tables are generated from these descriptions (docs/_ext/bridge_reference.py), so a
blank here would be a blank there."""

from __future__ import annotations

import dataclasses
import importlib

import click
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from bridge.cli import cli
from bridge.config import ClientConfig
from bridge.consumer.config import PushConsumerConfig
from bridge.coordinator import CoordinatorConfig
from bridge.db.tables import metadata
from bridge.observability.metrics import BridgeMetrics
from bridge.settings import OTHER_ENVIRONMENT, attribute_docs

SETTINGS = (ClientConfig, CoordinatorConfig, PushConsumerConfig)


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda cls: cls.__name__)
def test_every_setting_has_a_docstring(cls: type) -> None:
    docs = attribute_docs(cls)
    blank = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name, "").strip()]
    assert not blank, f"{cls.__name__} fields without a docstring: {blank}"


def test_attribute_docs_reads_the_string_after_an_assignment() -> None:
    docs = attribute_docs(ClientConfig)
    assert docs["namespace"] == "Prefix of system, retry and DLQ topics."
    assert "ALLOW_ALL" in attribute_docs(importlib.import_module("bridge.config"))


@pytest.mark.parametrize("entry", OTHER_ENVIRONMENT)
def test_every_other_environment_variable_has_a_docstring(entry: str) -> None:
    module_name, _, constant = entry.partition(":")
    module = importlib.import_module(module_name)
    assert getattr(module, constant).startswith(("BRIDGE_", "KAFKA_"))
    assert attribute_docs(module).get(constant, "").strip(), f"{entry} has no docstring"


def _options_with_envvar(command: click.Command) -> list[click.Option]:
    found = [p for p in command.params if isinstance(p, click.Option) and p.envvar]
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            found += _options_with_envvar(sub)
    return found


def test_every_command_line_option_with_an_environment_variable_has_help() -> None:
    options = _options_with_envvar(cli)
    assert options
    blank = [o.opts for o in options if not o.help]
    assert not blank


def test_every_metric_has_help() -> None:
    metrics = BridgeMetrics(CollectorRegistry(), process_metrics=False)
    found = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(found) > 20
    blank = [m._name for m in found if not m._documentation.strip()]
    assert not blank


def test_every_database_table_and_column_has_a_description() -> None:
    tables = metadata.sorted_tables
    assert len(tables) == 2
    blank = [t.name for t in tables if not str(t.info.get("doc", "")).strip()]
    blank += [f"{t.name}.{c.name}" for t in tables for c in t.columns if not (c.doc or "").strip()]
    assert not blank
