"""``bridge acls``: the Kafka ACLs each part of the bridge needs (the trust model's table)."""

from __future__ import annotations

import click


@click.group()
def acls() -> None:
    """Print or apply the Kafka ACLs the bridge's principals need."""
