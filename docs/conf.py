"""Sphinx configuration of the documentation site (``make docs``)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "docs" / "_ext")]

from bridge import __version__  # noqa: E402

project = "rocketmq-kafka-bridge"
release = __version__
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "bridge_reference",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = f"rocketmq-kafka-bridge {release}"

# Headings get anchors, so pages link to sections as ``page.md#a-heading``.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

# -n (nitpicky) makes every unresolved cross-reference an error; these are the targets outside
# the documented API: the standard library, third-party types in signatures, and the private
# modules a public docstring names.
nitpick_ignore_regex = [
    ("py:.*", r"(confluent_kafka|sqlalchemy|prometheus_client|click|opentelemetry)\..*"),
    ("py:.*", r"(abc|collections\.abc|typing|concurrent|asyncio|threading|enum|fnmatch)\..*"),
    # Private modules (the public names re-export what users need) and topics/ internals.
    ("py:.*", r"topics\..*"),
    (
        "py:.*",
        r"bridge\.(codec|lifecycle|delay_policy|client|consumer|aio\.runner|db\.transaction|"
        r"serialization|kafka_config)(\..*)?",
    ),
    ("py:.*", r"bridge\.observability\.(metrics|server|rdkafka_stats)(\..*)?"),
    # Names a docstring uses from its own module that autodoc does not describe (type
    # aliases, private constants) or from a third-party library.
    (
        "py:.*",
        r"(PropertyValue|(De)?[Ss]erializer|HealthCheck|WsgiApp|(Async)?Handler|(Async)?Engine|MessageKey|CollectorRegistry|"
        r"KafkaError|ServiceThread|registry|parse_count|SYSTEM_PROPERTIES|RENEWALS?_\w+|"
        r"MIN_TRANSACTION_RETENTION_MS|MAX_PROPERTIES_BYTES|Leases?|Leased|Held)",
    ),
]
