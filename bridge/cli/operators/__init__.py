"""The operators' commands: ``bridge transactions``, ``delays``, ``dlq`` and ``quarantine``
inspect what waits in the system topics and replay or drop it.

Every read command takes ``--json`` (one object per line), fails with exit status 3 when
Kafka cannot be reached within ``request_timeout_ms`` and with 4 when what it was asked about
does not exist (``bridge.cli.output``). One module per command group: ``transactions``,
``delays``, ``dead_letters`` (``dlq``) and ``quarantine``, over ``common``; ``bridge.cli``
imports each when its command runs."""
