"""The operators' commands: ``bridge transactions``, ``delays``, ``dlq`` and ``quarantine``
inspect what waits in the system topics and replay or drop it.

Every read command takes ``--json`` (one object per line), fails with exit status 3 when
Kafka cannot be reached within ``request_timeout_ms`` and with 4 when what it was asked about
does not exist (``bridge.cli_output``). One module per command group: ``transactions``,
``delays``, ``dead_letters`` (``dlq``) and ``quarantine``, over ``common``."""

from bridge.cli_operators.dead_letters import dlq
from bridge.cli_operators.delays import delays
from bridge.cli_operators.quarantine import quarantine_list
from bridge.cli_operators.transactions import transactions

__all__ = ["delays", "dlq", "quarantine_list", "transactions"]
