"""The development runtime: a local Kafka broker (:mod:`bridge.runtime.local_kafka`) and
three-node cluster (:mod:`bridge.runtime.cluster`) from Apache Kafka's Maven jars, their
certificates and SASL/ACL settings, a local PostgreSQL, and an Apache RocketMQ launcher for
side-by-side runs. What ``make up``, ``bridge up``, ``bridge broker``, the tests and the fault
suite start; never imported by the client library or the coordinator (the layer test refuses
it), nor by ``import bridge``.

It ships in the wheel on purpose: ``bridge broker`` and ``bridge up`` are commands of the
installed package, and ``LocalKafka`` is documented for an application's own tests
(docs/security.md). It adds no dependency: the jars are downloaded on first use into a cache
(``BRIDGE_CACHE_DIR``), and Java is needed only then."""
