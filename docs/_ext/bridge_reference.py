"""Reference tables generated from the code at build time, so they cannot drift from it.

Directives (each emits a table; descriptions are the code's own docstrings and help texts):

* ``bridge-settings MODULE.CLASS``: the fields of a settings dataclass, with type, default,
  the environment variable ``CLASS.from_env`` reads (found by running it on an environment
  that records what is asked) and the field's docstring.
* ``bridge-environment``: every environment variable: the settings dataclasses' (arguments:
  the classes), the command line options' ``envvar`` (walked from the click group) and the
  constants listed in ``bridge.settings.OTHER_ENVIRONMENT``.
* ``bridge-protected-properties``: ``bridge.config.PROTECTED_KAFKA_PROPERTIES``.
* ``bridge-acls``: the least-privilege ACLs :func:`topics.acls.acls_for` grants an example
  deployment given as options (the ``bridge acls print`` options), a row per role and
  resource with the operations and the code's reasons.
* ``bridge-metrics NAME...``: the metrics of ``BridgeMetrics`` named in the content (one
  per line); the ``bridge-metrics-complete`` check at the end of the build fails on a metric
  no page lists.

A missing description is a build error (and ``tests/unit/test_reference_descriptions.py``
fails on it first).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import click
from docutils import nodes
from docutils.statemachine import StringList
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import make_refnode
from sqlalchemy import Column, MetaData, Table
from sqlalchemy.dialects import postgresql

from bridge.config import PROTECTED_KAFKA_PROPERTIES
from bridge.kafka_config import REFUSED_SETTINGS, REQUIRED_VALUES
from bridge.message import MessageConst
from bridge.observability.metrics import BridgeMetrics
from bridge.settings import OTHER_ENVIRONMENT, attribute_docs
from topics.acls import Acl, Deployment, Operation, PatternType, ResourceType, Role, acls_for
from topics.catalog import SystemTopic
from topics.naming import DEFAULT_NAMESPACE, system_topic

_LISTED_METRICS = "bridge_reference_metrics"


def _import(dotted: str) -> Any:
    module, _, name = dotted.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module), name)


class _Recorder(Mapping[str, str]):
    """An empty environment that remembers every name asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.append(key)
        return default

    def __getitem__(self, key: str) -> str:
        self.asked.append(key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def env_names(cls: type[Any]) -> dict[str, str]:
    """Field name -> the environment variable ``cls.from_env`` reads for it."""
    from_env = getattr(cls, "from_env", None)
    if from_env is None:
        return {}
    recorder = _Recorder()
    from_env(recorder)
    names: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        for asked in recorder.asked:
            if asked.endswith(f.name.upper()) and f.name not in names:
                names[f.name] = asked
    return names


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str) -> str:
    # A list-table cell: one line of inline RST (a '|' would start a substitution).
    return _one_line(text).replace("|", "\\|") or "\\ "


def _literal(text: str) -> str:
    return f"``{text}``" if text else "\\ "


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
        if isinstance(value, enum.Enum):
            return _literal(value.name)
        return _literal(repr(value))
    if f.default_factory in (dict, list, tuple):
        return "none"
    return "computed (see the description)"


def _type_name(f: dataclasses.Field[Any]) -> str:
    return _literal(f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "?"))


class _TableDirective(SphinxDirective):
    """Builds a list-table from rows of inline RST and parses it in the page."""

    module_context: ClassVar[str | None] = None

    def table(self, title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[Any]:
        lines = [
            f".. list-table:: {title}",
            "   :header-rows: 1",
            "   :class: bridge-reference",
            "",
        ]
        for row in [list(header), *rows]:
            first, *rest = row
            lines.append(f"   * - {first}")
            lines.extend(f"     - {cell}" for cell in rest)
        if type(self.state).__module__.startswith("myst_parser"):
            # A Markdown page parses nested content as Markdown: hand the table to RST.
            lines = ["```{eval-rst}", *lines, "```"]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=self.get_source_info()[0]), 0, container)
        return list(container.children)

    def parse_in(self, module: str, cls: str | None, build: Any) -> list[Any]:
        """Run ``build()`` with ``module`` (and class ``cls``) as the context of the
        docstrings' relative cross-references (``:data:`NAME```)."""
        context = self.env.ref_context
        saved = {key: context.get(key) for key in ("py:module", "py:class")}
        context["py:module"] = module
        if cls:
            context["py:class"] = cls
        else:
            context.pop("py:class", None)
        try:
            return build()  # type: ignore[no-any-return]
        finally:
            for key, value in saved.items():
                if value is None:
                    context.pop(key, None)
                else:
                    context[key] = value


class SettingsDirective(_TableDirective):
    """``.. bridge-settings:: bridge.config.ClientConfig``"""

    required_arguments = 1

    def run(self) -> list[Any]:
        cls = _import(self.arguments[0])
        docs = attribute_docs(cls)
        env = env_names(cls)
        rows = []
        for f in dataclasses.fields(cls):
            if f.name not in docs:
                raise self.error(f"{cls.__qualname__}.{f.name} has no docstring")
            rows.append(
                [
                    _literal(f.name),
                    _type_name(f),
                    _default(f),
                    _literal(env.get(f.name, "")),
                    _cell(docs[f.name]),
                ]
            )
        header = ["Field", "Type", "Default", "Environment", "Description"]
        title = f":class:`~{cls.__module__}.{cls.__qualname__}`"
        return self.parse_in(
            cls.__module__, cls.__qualname__, lambda: self.table(title, header, rows)
        )


def _click_envvars(command: click.Command, path: str) -> Iterator[tuple[str, str, str]]:
    """(variable, the option or argument it sets, its help) of ``command`` and below."""
    for param in command.params:
        envvars = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
        for var in envvars:
            if isinstance(param, click.Option):
                what = f"``{path} {max(param.opts, key=len)}``"
                yield var, what, param.help or ""
            else:
                what = f"``{path} {(param.name or '').upper()}``"
                yield var, what, f"The {(param.name or '').upper()} argument of ``{path}``."
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None:
                continue
            yield from _click_envvars(sub, f"{path} {name}")


class EnvironmentDirective(_TableDirective):
    """``.. bridge-environment:: bridge.config.ClientConfig bridge.coordinator.CoordinatorConfig``

    Option ``:command:`` names the click group (``bridge.cli.cli``) and ``:prog:`` its name.
    """

    required_arguments = 1
    final_argument_whitespace = True
    option_spec: ClassVar[dict[str, Any]] = {"command": str, "prog": str}

    def run(self) -> list[Any]:
        rows: dict[str, list[str]] = {}
        for dotted in self.arguments[0].split():
            cls = _import(dotted)
            docs = attribute_docs(cls)
            for name, var in env_names(cls).items():
                role = f"``{cls.__qualname__}.{name}``"
                rows.setdefault(var, [_literal(var), role, _cell(docs[name])])
        command = _import(self.options.get("command", "bridge.cli.cli"))
        prog = self.options.get("prog", "rmq-bridge")
        for var, what, help_text in _click_envvars(command, prog):
            if var in rows:
                rows[var][1] += f", {what}"
            else:
                if not help_text:
                    raise self.error(f"{what} ({var}) has no help text")
                rows[var] = [_literal(var), what, _cell(help_text)]
        for entry in OTHER_ENVIRONMENT:
            module, _, constant = entry.partition(":")
            var = getattr(importlib.import_module(module), constant)
            doc = attribute_docs(importlib.import_module(module)).get(constant)
            if not doc:
                raise self.error(f"{entry} has no docstring")
            shown = f"{var}<PROPERTY>" if var.endswith("_") else var
            rows.setdefault(shown, [_literal(shown), f"``{module}``", _cell(doc)])
        header = ["Variable", "Sets", "Description"]
        return self.table("Environment variables", header, sorted(rows.values()))


class ProtectedPropertiesDirective(_TableDirective):
    """``.. bridge-protected-properties::``: librdkafka properties the bridge refuses."""

    def run(self) -> list[Any]:
        groups: dict[tuple[str, str], list[str]] = {}
        for name, reason in PROTECTED_KAFKA_PROPERTIES.items():
            groups.setdefault(reason, []).append(_literal(name))
        rows = [
            [", ".join(names), _cell(why), _cell(instead)]
            for (why, instead), names in groups.items()
        ]
        return self.table("Protected librdkafka properties", ["Property", "Why", "Instead"], rows)


def first_sentence(obj: Any) -> str:
    """The first sentence of ``obj``'s docstring, on one line."""
    doc = _one_line(inspect.getdoc(obj) or "")
    match = re.match(r"(.+?\.)(?:\s|$)", doc)
    return match.group(1) if match else doc


def _call(line: str, module: str) -> tuple[Callable[..., Any], list[Any], dict[str, Any]]:
    """``function(literal, ..., name=literal)`` read from ``line``, the function a name in
    ``module`` (no code is run but the call itself)."""
    tree = ast.parse(line, mode="eval").body
    if not isinstance(tree, ast.Call) or not isinstance(tree.func, ast.Name):
        raise ValueError(f"not a call of a function of {module}: {line!r}")
    function = getattr(importlib.import_module(module), tree.func.id)
    args = [ast.literal_eval(arg) for arg in tree.args]
    kwargs = {str(kw.arg): ast.literal_eval(kw.value) for kw in tree.keywords}
    return function, args, kwargs


class NamesDirective(_TableDirective):
    """``.. bridge-names::`` with one call a line, e.g. ``retry_topic("order_consumer")``:
    each call, what it returns and the first sentence of the function's docstring.

    Option ``:module:`` is where the functions are (default ``topics.naming``), ``:result:``
    the result column's heading.
    """

    has_content = True
    option_spec: ClassVar[dict[str, Any]] = {"module": str, "result": str, "caption": str}

    def run(self) -> list[Any]:
        module = self.options.get("module", "topics.naming")
        rows = []
        for line in (line.strip() for line in self.content if line.strip()):
            try:
                function, args, kwargs = _call(line, module)
            except (ValueError, SyntaxError, AttributeError) as exc:
                raise self.error(str(exc)) from exc
            what = first_sentence(function)
            if not what:
                raise self.error(f"{module}.{function.__name__} has no docstring")
            rows.append([_literal(line), _literal(str(function(*args, **kwargs))), _cell(what)])
        header = ["Call", self.options.get("result", "Kafka name"), "What"]
        caption = self.options.get("caption", "Names")
        return self.parse_in(module, None, lambda: self.table(caption, header, rows))


class SystemTopicsDirective(_TableDirective):
    """``.. bridge-system-topics::``: each :class:`topics.catalog.SystemTopic`, its Kafka
    name in the default namespace and its docstring."""

    def run(self) -> list[Any]:
        docs = attribute_docs(SystemTopic)
        rows = []
        for member in SystemTopic:
            if not docs.get(member.name):
                raise self.error(f"SystemTopic.{member.name} has no docstring")
            kafka = system_topic(member.value, DEFAULT_NAMESPACE)
            rows.append([_literal(member.value), _literal(kafka), _cell(docs[member.name])])
        header = ["RocketMQ name", "Kafka topic", "What"]
        return self.parse_in(
            "topics.catalog", "SystemTopic", lambda: self.table("System topics", header, rows)
        )


def _plain(text: str) -> str:
    """Plain text as inline RST (no markup, e.g. a ``*`` or ``_`` in a reason)."""
    return re.sub(r"([\\`*_|])", r"\\\1", _one_line(text)) or "\\ "


_RESOURCE_WORDS = {
    ResourceType.TOPIC: "topic",
    ResourceType.GROUP: "group",
    ResourceType.TRANSACTIONAL_ID: "transactional id",
    ResourceType.CLUSTER: "cluster",
}


def _resource(acl: Acl) -> str:
    prefixed = acl.pattern is PatternType.PREFIXED
    word = _RESOURCE_WORDS[acl.resource_type]
    if prefixed:
        word += "s"
    return f"{word} {_literal(acl.name)}" + (" (prefixed)" if prefixed else "")


def _pairs(text: str) -> dict[str, str]:
    """``GROUP=PRINCIPAL ...`` (blank-separated) as a mapping."""
    pairs = dict(pair.partition("=")[::2] for pair in text.split())
    if not all(pairs) or not all(pairs.values()):
        raise ValueError(f"expected GROUP=PRINCIPAL ..., got {text!r}")
    return pairs


class AclsDirective(_TableDirective):
    """``.. bridge-acls::`` with options as ``bridge acls print`` takes them: ``:namespace:``
    (default the default namespace), ``:topics:`` (blank-separated), ``:producer:``,
    ``:transactional:`` and ``:consumer:`` (``GROUP=PRINCIPAL``, blank-separated),
    ``:coordinator:``, ``:spark:``, ``:operator:``. A row per role and resource (type, name,
    pattern), roles in the order :func:`topics.acls.acls_for` grants them."""

    option_spec: ClassVar[dict[str, Any]] = {
        name: str
        for name in (
            "namespace", "topics", "producer", "transactional", "coordinator", "consumer",
            "spark", "operator",
        )
    }  # fmt: skip

    def run(self) -> list[Any]:
        opts = self.options
        try:
            deployment = Deployment(
                namespace=opts.get("namespace", DEFAULT_NAMESPACE),
                topics=tuple(opts.get("topics", "").split()),
                producer=opts.get("producer"),
                transactional_producers=_pairs(opts.get("transactional", "")),
                coordinator=opts.get("coordinator"),
                consumers=_pairs(opts.get("consumer", "")),
                spark=opts.get("spark"),
                operator=opts.get("operator"),
            )
        except ValueError as exc:  # InvalidArgumentError is one
            raise self.error(str(exc)) from exc
        rows = [self._row(first, acls) for first, acls in self._grouped(acls_for(deployment))]
        header = ["Role", "Resource (pattern)", "Operations", "Why"]
        title = f"ACLs of the example deployment (namespace ``{deployment.namespace}``)"
        return self.table(title, header, rows)

    @staticmethod
    def _grouped(acls: list[Acl]) -> list[tuple[bool, list[Acl]]]:
        """The ACLs by role (in :class:`~topics.acls.Role` order, the order of the grants)
        and resource (topics, groups, transactional ids, the cluster); True marks a role's
        first resource."""
        roles = {role.value: rank for rank, role in enumerate(Role)}
        types = list(ResourceType)

        def rank(a: Acl) -> tuple[int, str, int, str]:
            return roles[a.role.split()[0]], a.role, types.index(a.resource_type), a.name

        by_resource: dict[tuple[str, str, str, str], list[Acl]] = {}
        for acl in sorted(acls, key=rank):
            by_resource.setdefault((acl.role, *acl.key[1:4]), []).append(acl)
        grouped: list[tuple[bool, list[Acl]]] = []
        last_role = None
        for (role, *_), group in by_resource.items():
            grouped.append((role != last_role, group))
            last_role = role
        return grouped

    @staticmethod
    def _row(first: bool, acls: list[Acl]) -> list[str]:
        acl = acls[0]
        role = f"{_plain(acl.role)} (``{acl.principal}``)" if first else "\\ "
        rank = list(Operation)
        acls = sorted(acls, key=lambda a: rank.index(a.operation))
        ops = ", ".join(a.operation.value for a in acls)
        reasons = "; ".join(dict.fromkeys(a.reason for a in acls))
        return [role, _resource(acl), ops, _plain(reasons)]


_POSTGRESQL = postgresql.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy's is untyped
"""Column types are shown as PostgreSQL names them."""


def _column_notes(column: Column[Any]) -> str:
    notes = ["primary key" if column.primary_key else ""]
    notes.append("" if column.nullable else "not null")
    table = column.table
    if isinstance(table, Table):
        notes += [f"index ``{i.name}``" for i in table.indexes if column.name in i.columns]
    return ", ".join(note for note in notes if note)


class TablesDirective(_TableDirective):
    """``.. bridge-tables:: bridge.db.metadata``: a table per SQLAlchemy table of the
    metadata: each column's name, type, key and index, and its ``doc``."""

    required_arguments = 1

    def run(self) -> list[Any]:
        metadata = _import(self.arguments[0])
        if not isinstance(metadata, MetaData):
            raise self.error(f"{self.arguments[0]} is no SQLAlchemy MetaData")
        found: list[Any] = []
        for table in metadata.sorted_tables:
            what = table.info.get("doc")
            if not what:
                raise self.error(f"table {table.name} has no info['doc']")
            rows = []
            for column in table.columns:
                if not column.doc:
                    raise self.error(f"column {table.name}.{column.name} has no doc")
                kind = column.type.compile(dialect=_POSTGRESQL)
                notes = _column_notes(column)
                rows.append([_literal(column.name), _literal(kind), notes, _cell(column.doc)])
            title = f"``{table.name}``: {_one_line(what)}"
            found += self.table(title, ["Column", "Type", "Key, index", "Description"], rows)
        return found


def _all_metrics() -> dict[str, MetricWrapperBase]:
    metrics = BridgeMetrics(CollectorRegistry(), process_metrics=False)
    found = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    return {exported_name(m): m for m in found}


def exported_name(metric: MetricWrapperBase) -> str:
    """The name Prometheus scrapes (a counter's with ``_total``)."""
    name: str = metric._name
    return f"{name}_total" if metric._type == "counter" else name


class KafkaConfigDirective(_TableDirective):
    """``.. bridge-kafka-config:: required`` (or ``refused``): the confluent-kafka settings
    :mod:`bridge.kafka_config` accepts only with the bridge's own value, or refuses."""

    required_arguments = 1

    def run(self) -> list[Any]:
        kind = self.arguments[0]
        groups: dict[tuple[str, str], list[str]] = {}
        if kind == "required":
            for name, (values, why) in REQUIRED_VALUES.items():
                accepted = ", ".join(_literal(v) for v in sorted(values, key=len))
                groups.setdefault((accepted, why), []).append(_literal(name))
            rows = [[", ".join(names), a, _cell(why)] for (a, why), names in groups.items()]
            header = ["Setting", "Accepted", "Why"]
            title = ":data:`~bridge.kafka_config.REQUIRED_VALUES`"
        elif kind == "refused":
            rows = [[_literal(name), _cell(why)] for name, why in REFUSED_SETTINGS.items()]
            header, title = ["Setting", "Why"], ":data:`~bridge.kafka_config.REFUSED_SETTINGS`"
        else:
            raise self.error(f"unknown kind {kind!r}: required or refused")
        return self.table(title, header, rows)


class PropertiesDirective(_TableDirective):
    """``.. bridge-properties:: topics.properties.TRACE_PROPERTIES``: each property of the
    tuple, its :class:`~bridge.message.MessageConst` name and that constant's docstring."""

    required_arguments = 1

    def run(self) -> list[Any]:
        docs = attribute_docs(MessageConst)
        names = {getattr(MessageConst, n): n for n in docs if not n.startswith("_")}
        rows = []
        for value in _import(self.arguments[0]):
            name = names.get(value)
            if name is None:
                raise self.error(f"{value!r} is no documented MessageConst")
            rows.append([_literal(value), _literal(name), _cell(docs[name])])
        header = ["Property", "MessageConst", "Value"]
        return self.parse_in(
            "bridge.message", "MessageConst", lambda: self.table("Properties", header, rows)
        )


def _buckets(metric: MetricWrapperBase) -> str:
    """A histogram's bucket bounds (in the metric's unit), as a sentence."""
    bounds = [b for b in getattr(metric, "_upper_bounds", ()) if b != float("inf")]
    return f" Buckets: {', '.join(f'{b:g}' for b in bounds)}." if bounds else ""


class MetricsDirective(_TableDirective):
    """``.. bridge-metrics::`` with one metric name a line."""

    has_content = True

    def run(self) -> list[Any]:
        metrics = _all_metrics()
        listed = _listed(self.env).setdefault(self.env.docname, set())
        rows = []
        for name in (line.strip() for line in self.content if line.strip()):
            metric = metrics.get(name)
            if metric is None:
                raise self.error(f"no metric {name!r} in BridgeMetrics")
            listed.add(name)
            labels = ", ".join(metric._labelnames)
            kind, doc = str(metric._type), str(metric._documentation)
            rows.append([_literal(name), kind, labels, _cell(doc + _buckets(metric))])
        return self.table("Metrics", ["Name", "Type", "Labels", "Meaning"], rows)


def _listed(env: BuildEnvironment) -> dict[str, set[str]]:
    """Page -> the metrics its tables list (kept in the environment across builds)."""
    if not hasattr(env, _LISTED_METRICS):
        setattr(env, _LISTED_METRICS, {})
    listed: dict[str, set[str]] = getattr(env, _LISTED_METRICS)
    return listed


def _forget_page(app: Sphinx, env: BuildEnvironment, docname: str) -> None:
    _listed(env).pop(docname, None)


def _check_metrics_listed(app: Sphinx, env: BuildEnvironment) -> None:
    listed = set().union(*_listed(env).values())
    missing = sorted(set(_all_metrics()) - listed)
    if listed and missing:
        raise ExtensionError(f"metrics in no bridge-metrics table: {', '.join(missing)}")


class _DocumentedOnce:
    """autodoc-skip-member: a public object several modules export (``bridge.ConsumeStatus``
    is ``bridge.aio.ConsumeStatus``) is described once, under the first module the pages
    document it in; the others skip it."""

    def __init__(self) -> None:
        self.first: dict[int, str] = {}

    def __call__(  # noqa: PLR0917 - Sphinx passes the event's arguments by position
        self, app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: Any
    ) -> bool | None:
        if what != "module" or skip or not isinstance(obj, type | Callable):
            return None
        module = app.env.temp_data.get("autodoc:module") or app.env.ref_context.get("py:module")
        first = self.first.setdefault(id(obj), str(module))
        return True if first != str(module) else None


def _resolve_short_name(
    app: Sphinx, env: BuildEnvironment, node: Any, contnode: nodes.Element
) -> nodes.Element | None:
    """A ``:class:`SendError``` written in a module that does not define it resolves to the
    one documented object of that name, if there is exactly one."""
    if node.get("refdomain") != "py":
        return None
    target = str(node["reftarget"]).lstrip("~.")
    domain = env.domains["py"]
    found = [name for name in domain.objects if name == target or name.endswith("." + target)]
    canonical = {domain.objects[name].docname + domain.objects[name].node_id for name in found}
    if len(canonical) != 1:
        return None
    name = found[0]
    entry = domain.objects[name]
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, name)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("autodoc-skip-member", _DocumentedOnce())
    app.connect("missing-reference", _resolve_short_name)
    app.add_directive("bridge-settings", SettingsDirective)
    app.add_directive("bridge-environment", EnvironmentDirective)
    app.add_directive("bridge-protected-properties", ProtectedPropertiesDirective)
    app.add_directive("bridge-metrics", MetricsDirective)
    app.add_directive("bridge-names", NamesDirective)
    app.add_directive("bridge-kafka-config", KafkaConfigDirective)
    app.add_directive("bridge-properties", PropertiesDirective)
    app.add_directive("bridge-tables", TablesDirective)
    app.add_directive("bridge-system-topics", SystemTopicsDirective)
    app.add_directive("bridge-acls", AclsDirective)
    app.connect("env-purge-doc", _forget_page)
    app.connect("env-updated", _check_metrics_listed)
    return {"version": "1", "parallel_read_safe": False, "parallel_write_safe": True}
