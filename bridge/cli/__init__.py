"""The operator tools: what the ``bridge`` command runs (the root group and ``up`` and
``fetch`` in :mod:`bridge.cli.root`, a module per command group beside it), the console it
serves (:mod:`bridge.cli.console`) and the operators' views of the coordinator's topics
(:mod:`bridge.cli.admin`). Never imported by the client library or the coordinator.

``bridge.cli:main`` is the console script (``bridge``, ``rmq-bridge``); ``bridge.cli:cli`` its
click group."""

from bridge.cli.root import cli, main

__all__ = ["cli", "main"]
