"""``python -m bridge``: the command line, as ``rmq-bridge`` (or ``bridge``) runs it."""

from bridge.cli import main

main()
