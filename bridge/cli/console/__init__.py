"""The operator console: ``bridge console`` serves server-rendered pages over the same operator
code as the ``bridge`` commands (transactions, delays and timers, dead letters, quarantine,
health) for one namespace, read-only unless started with ``--write`` (docs/console.md).

Flask is the ``console`` extra: importing this package needs nothing of it; building the app
(:func:`bridge.cli.console.app.create_app`) does, and raises :class:`ConsoleUnavailableError`
naming the extra when it is missing."""

from __future__ import annotations

from bridge.errors import ConsoleUnavailableError

__all__ = ["ConsoleUnavailableError", "require_flask"]


def require_flask() -> None:
    """Raise :class:`ConsoleUnavailableError` unless Flask (the ``console`` extra) imports."""
    try:
        import flask  # noqa: F401, PLC0415 - only to learn whether the extra is installed
    except ImportError as exc:
        raise ConsoleUnavailableError(
            "bridge console needs the 'console' extra: pip install 'rocketmq-kafka-bridge[console]'"
        ) from exc
