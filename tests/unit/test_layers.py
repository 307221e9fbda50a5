"""Layers import only downward, and each process's code only what that process runs: each
module of ``topics/``, ``bridge/`` and ``spark_jobs/`` is parsed with :mod:`ast` and every import
(module level, inside a function or under ``if TYPE_CHECKING:``) is checked against the layer
table and the process table below, and the imports together must form no cycle.

From the bottom: names and wire format (``topics``), the core model and settings, the pure
rules and record codec, the Kafka adapters, the client library's producer core, the services
(the consumer and the client half of transactions; the coordinator's transaction and delay
services), the coordinator process and the asyncio and RocketMQ 5 clients, the database in the
loop, the development runtime, and the operator tools (the ``bridge`` command, its console, the
admin views). A module may import its own layer or lower ones; services do not import other
services' packages (only what lies below them). The Spark jobs import only ``topics`` and each
other, so a Spark driver needs neither confluent-kafka nor the bridge.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("names and wire format", ("topics",)),
    (
        "core model and settings",
        (
            "bridge.errors",
            "bridge.settings",
            "bridge.delay_policy",
            "bridge.config",
            "bridge.client_configuration",
            "bridge.property_values",
            "bridge.message_id",
            "bridge.message",
            "bridge.kafka_config",
            "bridge.serialization",
            "bridge.tracing",
            "bridge.lifecycle",
        ),
    ),
    (
        "pure rules and record codec",
        (
            "bridge.codec",
            "bridge.delay",
            "bridge.consumer.model",
            "bridge.consumer.sql92",
            "bridge.consumer.process_queue",
            "bridge.consumer.invisibility",
            "bridge.consumer.message_groups",
            "bridge.transaction.model",
            "bridge.coordinator.transaction.pending",
            "bridge.coordinator.transaction.state",
        ),
    ),
    ("adapters", ("bridge.kafka", "bridge.observability")),
    ("clients", ("bridge.client",)),
    (
        "services",
        (
            "bridge.consumer",
            "bridge.transaction",
            "bridge.coordinator.transaction",
            "bridge.coordinator.delay",
        ),
    ),
    (
        "coordinator, asyncio and RocketMQ 5 clients",
        ("bridge.coordinator", "bridge.aio", "bridge.v5"),
    ),
    # The database in the loop: listeners for the producer and consumer clients, threaded and
    # asyncio (SQLAlchemy, an optional extra: the entry points import it only when called).
    ("database in the loop", ("bridge.db",)),
    # Above every client and the coordinator: none of them may import it.
    ("development runtime", ("bridge.runtime",)),
    ("operator tools and the public facade", ("bridge.__main__", "bridge.cli", "bridge")),
]
"""Bottom first. A module belongs to the layer of its longest matching prefix; ``bridge`` names
only the package's ``__init__`` (the public facade), so a new module must be placed here."""

SERVICES = LAYERS.index(next(layer for layer in LAYERS if layer[0] == "services"))

PROCESSES: dict[str, tuple[str, ...]] = {
    "client library": (
        "bridge",
        "bridge.client",
        "bridge.consumer",
        "bridge.transaction",
        "bridge.aio",
        "bridge.v5",
        "bridge.db",
    ),
    "coordinator": ("bridge.coordinator",),
    "operator tools": ("bridge.cli", "bridge.__main__"),
    "development runtime": ("bridge.runtime",),
    # Read by both halves of a transaction: the listener interface and the records the
    # producer and the coordinator exchange (END requests, check requests, OP records).
    "shared": ("topics", "bridge.transaction.model"),
}
"""Which process runs a module (longest matching prefix; ``bridge`` is the package's
``__init__`` alone, the client library's public names). A module in none is shared core
(errors, settings, message, codec, the delay rules, Kafka adapters, observability)."""

MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "shared": ("shared",),
    "client library": ("shared", "client library"),
    "coordinator": ("shared", "coordinator"),
    "development runtime": ("shared", "development runtime"),
    "operator tools": ("shared", "client library", "coordinator", "development runtime"),
}
"""A process's code imports shared code, its own, and (operator tools alone) the others'."""

SPARK_ALLOWED = ("topics", "spark_jobs")
SPARK_LAZY_ALLOWED = {("spark_jobs.common", "bridge.runtime.jars")}
"""Imported inside a function only: the local jar cache, not needed under spark-submit."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _matches(module: str, prefix: str) -> bool:
    # The package itself ("bridge") is the facade; its modules are listed on their own.
    return module == prefix or (prefix != "bridge" and module.startswith(prefix + "."))


def _layer(module: str) -> tuple[int, str]:
    """(layer index, matching prefix) of a project module."""
    best: tuple[int, str] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if _matches(module, prefix) and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def _process(module: str) -> str:
    """The process that runs a project module ("shared" for shared core)."""
    best = ("shared", "")
    for process, prefixes in PROCESSES.items():
        for prefix in prefixes:
            if _matches(module, prefix) and len(prefix) > len(best[1]):
                best = (process, prefix)
    return best[0]


LAZY_IMPORT_TABLES = ("_EXPORTS", "_COMMANDS")
"""Module-level dicts whose values name modules imported when first asked for
(``bridge.__init__``'s public names, ``bridge.cli.root``'s commands): ``"module"`` or
``"module:attribute"`` strings, checked as imports of their module."""


def _lazy_imports(tree: ast.Module) -> list[str]:
    """The modules named by the values of :data:`LAZY_IMPORT_TABLES` in ``tree``."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if names & set(LAZY_IMPORT_TABLES) and isinstance(value, ast.Dict):
            for item in value.values:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    found.append(item.value.partition(":")[0])
    return found


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level) for every absolute import of the project's own
    packages in ``path``, and every module a lazy import table names (counted as at module
    level: it is imported as soon as its name is used)."""
    tree = ast.parse(path.read_text(), str(path))
    top_level = {id(node) for node in tree.body}
    found = [
        (name, True)
        for name in _lazy_imports(tree)
        if name.split(".")[0] in ("bridge", "topics", "spark_jobs")
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in ("bridge", "topics", "spark_jobs"):
                found.append((name, id(node) in top_level))
    return found


def _sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def test_no_relative_imports() -> None:
    relative = [
        str(path.relative_to(ROOT))
        for path in _sources("bridge", "topics", "spark_jobs")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert relative == [], "relative imports escape the layer check"


def test_bridge_and_topics_import_only_downward() -> None:
    wrong = []
    for path in _sources("bridge", "topics"):
        module = _module_name(path)
        layer, _ = _layer(module)
        for target, _ in _imports(path):
            target_layer, _ = _layer(target)
            if target_layer > layer:
                wrong.append(
                    f"{module} ({LAYERS[layer][0]}) imports {target} ({LAYERS[target_layer][0]})"
                )
            elif target_layer == layer == SERVICES and _layer(target)[1] != _layer(module)[1]:
                wrong.append(f"service {module} imports another service's {target}")
    assert wrong == []


def test_each_process_imports_only_shared_code_and_its_own() -> None:
    wrong = [
        f"{module} ({_process(module)}) imports {target} ({_process(target)})"
        for path in _sources("bridge", "topics")
        for module in [_module_name(path)]
        for target, _ in _imports(path)
        if _process(target) not in (_process(module), *MAY_IMPORT[_process(module)])
    ]
    assert wrong == []


def test_topics_import_nothing_from_bridge() -> None:
    wrong = [
        f"{_module_name(path)} imports {target}"
        for path in _sources("topics")
        for target, _ in _imports(path)
        if not target.startswith("topics")
    ]
    assert wrong == []


def test_spark_jobs_import_only_topics() -> None:
    wrong = []
    for path in _sources("spark_jobs"):
        module = _module_name(path)
        for target, top_level in _imports(path):
            if target.split(".")[0] in SPARK_ALLOWED:
                continue
            if not top_level and (module, target) in SPARK_LAZY_ALLOWED:
                continue
            wrong.append(f"{module} imports {target}")
    assert wrong == []


def _module_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports (at module level, inside a function or
    for type hints only). ``from package import module`` imports ``module``; an imported name
    that is no module counts as its module's."""
    paths = {_module_name(path): path for path in _sources("bridge", "topics", "spark_jobs")}
    graph: dict[str, set[str]] = {module: set() for module in paths}
    for module, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                names = [name if name in paths else node.module for name in names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                target = name
                while target and target not in paths:  # a name of a module: that module
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (its modules in import order, the first one again at the end) for each
    group of modules that import each other (a strongly connected component of ``graph``,
    Tarjan's algorithm without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    cycles = []
    for group in groups:
        # The shortest way back to the group's first module (breadth first, inside the group).
        start = min(group)
        came_from: dict[str, str] = {}
        frontier = [start]
        while start not in came_from:
            reached = []
            for node in frontier:
                for target in sorted(graph[node] & group):
                    if target not in came_from:
                        came_from[target] = node
                        reached.append(target)
            frontier = reached
        path = [start]
        while came_from[path[-1]] != start:
            path.append(came_from[path[-1]])
        cycles.append([start, *reversed(path[1:]), start])
    return sorted(cycles)


def test_no_import_cycle() -> None:
    # Imports made only for type hints count: a cycle through them is a design cycle all the
    # same (and becomes a real one as soon as a hint is needed at run time).
    cycles = [" -> ".join(cycle) for cycle in _cycles(_module_graph())]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_cycle_check_names_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_layer_table_detects_an_upward_import() -> None:
    # The check itself: the configuration importing the delay service package is refused.
    assert _layer("bridge.coordinator.delay.service")[0] > _layer("bridge.config")[0]
    assert _layer("bridge.delay.model")[0] > _layer("bridge.config")[0]
    assert _layer("bridge.cli.topics")[0] == len(LAYERS) - 1
    with pytest.raises(AssertionError, match="in no layer"):
        _layer("bridge.unplaced")
    # Services apart: the coordinator's delay service may not import its transaction service.
    assert (
        _layer("bridge.coordinator.delay.fetch")[1] != _layer("bridge.coordinator.transaction")[1]
    )
    # The client library may not import the runtime, nor the coordinator's code.
    assert _layer("bridge.runtime.jars")[0] > _layer("bridge.aio.producer")[0]
    assert _process("bridge.coordinator.transaction.service") not in MAY_IMPORT["client library"]
    assert _process("bridge.runtime.local_kafka") not in MAY_IMPORT["coordinator"]
    assert _process("bridge.transaction.producer") == _process("bridge") == "client library"
    assert _process("bridge.transaction.model") == _process("bridge.codec") == "shared"
    assert _process("bridge.cli.console.app") == "operator tools"


@pytest.mark.parametrize("heavy", ["confluent_kafka", "bridge"])
def test_importing_the_spark_jobs_loads_no_kafka_client(heavy: str) -> None:
    code = (
        "import sys\n"
        "import spark_jobs.ingest, spark_jobs.transaction_audit, spark_jobs.dlq_report\n"
        "import spark_jobs.jars\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] == {heavy!r})\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "", f"importing the Spark jobs loaded {done.stdout.strip()}"


def test_lazy_import_tables_are_read(tmp_path: Path) -> None:
    # The facade's public names and the bridge command's commands are imported by name when
    # first used: the checks above must see them, or a lazy name could pull the coordinator
    # or the development runtime into the client library unnoticed.
    facade = tmp_path / "facade.py"
    facade.write_text(
        "from typing import Final\n"
        '_EXPORTS: dict[str, str] = {"Coordinator": "bridge.coordinator"}\n'
        '_COMMANDS: Final = {"up": "bridge.runtime.local_kafka:up", "x": "json:dumps"}\n'
    )
    assert _imports(facade) == [("bridge.coordinator", True), ("bridge.runtime.local_kafka", True)]
    commands = [target for target, _ in _imports(ROOT / "bridge" / "cli" / "root.py")]
    assert "bridge.cli.console.cli" in commands and "bridge.cli.operators.dead_letters" in commands
