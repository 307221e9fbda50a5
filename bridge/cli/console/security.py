"""The console's rules for writes, apart from any web framework: the operator token, the
per-session CSRF token and the same-origin check. Every write needs all three to pass; reads
need none (the console binds loopback by default and renders no secret)."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

TOKEN_ENV: Final = "BRIDGE_CONSOLE_TOKEN"
"""The environment variable holding the operator token (else one is generated and printed once
at start)."""

TOKEN_HEADER: Final = "X-Console-Token"
"""The request header that may carry the operator token (else the ``token`` form field)."""

CSRF_FIELD: Final = "csrf_token"
"""The form field (or ``X-CSRF-Token`` header) carrying the session's CSRF token."""

AUDIT_LOGGER: Final = "bridge.console.audit"
"""The logger of every write, done or refused: who (the token holder, from which address) and
what; logged at INFO whatever ``-v`` says."""

MIN_TOKEN_LENGTH: Final = 16
"""The shortest operator token accepted from the environment, characters."""


class WriteRefused(Exception):  # noqa: N818 - a refusal, answered with 403, not a failure
    """A write the console refuses; ``reason`` says which check failed (never a secret)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def new_token() -> str:
    """A fresh random operator token (32 bytes, URL-safe base64)."""
    return secrets.token_urlsafe(32)


def new_session_id() -> str:
    """A fresh random session id, for the session cookie."""
    return secrets.token_urlsafe(24)


def token_matches(expected: str, given: str | None) -> bool:
    """True when ``given`` is the operator token (a comparison in constant time)."""
    if not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


@dataclass(frozen=True, slots=True)
class CsrfSigner:
    """Derives a session's CSRF token from a server secret: HMAC-SHA256 of the session id, so
    the server keeps no per-session state and a token is worth nothing in another session."""

    secret: bytes

    def token(self, session_id: str) -> str:
        """The CSRF token of ``session_id``."""
        return hmac.new(self.secret, session_id.encode(), hashlib.sha256).hexdigest()

    def valid(self, session_id: str | None, given: str | None) -> bool:
        """True when ``given`` is the CSRF token of ``session_id`` (both present)."""
        if not session_id or not given:
            return False
        return hmac.compare_digest(self.token(session_id), given)


def _origin(url: str) -> tuple[str, str] | None:
    """(scheme, host[:port]) of ``url``, lower case; None when it has neither."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return None
    return parts.scheme.lower(), parts.netloc.lower()


def same_origin(host_url: str, origin: str | None, referer: str | None) -> bool:
    """True when the request came from a page of this console: its ``Origin`` header, or
    without one its ``Referer``, names the same scheme, host and port as ``host_url`` (the URL
    the request was sent to). A request with neither is refused: browsers send ``Origin`` with
    every form POST, so only something else omits both."""
    own = _origin(host_url)
    if own is None:
        return False
    claimed = origin if origin and origin != "null" else referer
    if not claimed:
        return False
    return _origin(claimed) == own


LOOPBACK_NAMES: Final = frozenset({"127.0.0.1", "localhost", "::1"})


def host_allowed(host_header: str | None, allowed: frozenset[str]) -> bool:
    """True when the ``Host`` a request was sent to names the console: a loopback name or one
    of ``allowed`` (the port is not judged). A page of another site whose name was made to
    resolve to this machine (DNS rebinding) sends its own name, and is refused."""
    if not host_header:
        return False
    name = urlsplit(f"//{host_header}").hostname
    return name is not None and (name in LOOPBACK_NAMES or name in allowed)


def check_write(
    *,
    allow_writes: bool,
    token: str,
    given_token: str | None,
    signer: CsrfSigner,
    session_id: str | None,
    given_csrf: str | None,
    host_url: str,
    origin: str | None,
    referer: str | None,
) -> None:
    """Raise :class:`WriteRefused` unless the console takes writes, the request carries the
    operator token, the session's CSRF token, and comes from the console's own origin."""
    if not allow_writes:
        raise WriteRefused("the console is read-only (start it with --write)")
    if not token_matches(token, given_token):
        raise WriteRefused("missing or wrong operator token")
    if not signer.valid(session_id, given_csrf):
        raise WriteRefused("missing or wrong CSRF token")
    if not same_origin(host_url, origin, referer):
        raise WriteRefused("cross-origin request")


DRY_RUN_FIELD: Final = "dry_run_token"
"""The form field carrying the token a dry run issued, which its replay must present."""

DRY_RUN_TTL_MS: Final = 10 * 60_000
"""How long a dry run's token lets its replay be written, ms: an operator reads the dry run
and confirms within minutes; later, the queue may have changed, so the dry run is run again."""

DRY_RUN_CLOCK_SKEW_MS: Final = 5_000
"""How far in the future a dry run's time may lie and still be taken, ms (never more than the
console's own clock moving back)."""


class DryRunRefused(WriteRefused):
    """A replay without a valid token of a dry run of the same letters: answered with 409."""


def replay_selection(
    *,
    group: str,
    target: str,
    scope: str,
    refs: list[tuple[int, int]],
    keys: tuple[str, ...],
    tags: tuple[str, ...],
    msg_ids: tuple[str, ...],
    ends: dict[int, int],
) -> str:
    """One text naming what a dead-letter replay writes, so that a dry run and its replay can
    be compared: the group, the target, and either the selected letters (``partition@offset``,
    in any order) or the filter and the offset each partition is read up to (the queue as the
    dry run saw it). Filter terms are a set: their order does not matter."""
    if scope == "selected":
        chosen: list[Any] = sorted(set(refs))
    else:
        chosen = [sorted(set(keys)), sorted(set(tags)), sorted(set(msg_ids)), sorted(ends.items())]
    return json.dumps([group, target, scope, chosen], separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class DryRunSigner:
    """Issues and checks the token a dry run gives its replay: ``<issued ms>.<HMAC-SHA256 of
    the session id, that time and the selection>`` under the server's secret. The server keeps
    no state; the token is worth nothing for other letters, in another session, after
    :attr:`ttl_ms` or after a restart (a new secret)."""

    secret: bytes
    ttl_ms: int = DRY_RUN_TTL_MS

    def _mac(self, session_id: str, issued_ms: int, selection: str) -> str:
        # "dry-run" and NUL separators: no CSRF token (an HMAC of a bare session id) and no
        # other session's, time's or selection's input is ever the same bytes.
        message = f"dry-run\0{session_id}\0{issued_ms}\0{selection}".encode()
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()

    def token(self, session_id: str, selection: str, issued_ms: int) -> str:
        """The token of a dry run of ``selection`` in ``session_id`` made at ``issued_ms``
        (ms since the epoch)."""
        return f"{issued_ms}.{self._mac(session_id, issued_ms, selection)}"

    def check(self, session_id: str | None, selection: str, given: str | None, now_ms: int) -> None:
        """Raise :class:`DryRunRefused` unless ``given`` is the token of a dry run of
        ``selection`` in ``session_id`` made no longer than :attr:`ttl_ms` before ``now_ms``."""
        if not given:
            raise DryRunRefused("no dry run: a replay needs the token of a dry run of its letters")
        issued, sep, mac = given.partition(".")
        # At most 19 digits: Python refuses to convert more than 4,300, and no time has more.
        if (
            not sep
            or len(issued) > 19
            or not issued.isascii()
            or not issued.isdigit()
            or not session_id
        ):
            raise DryRunRefused("malformed dry-run token")
        issued_ms = int(issued)
        if issued != str(issued_ms):
            # One dry run, one token text: "0<token>" would pass the MAC yet be another key
            # of SpentDryRuns, and let the dry run's replay be written twice.
            raise DryRunRefused("malformed dry-run token")
        if not hmac.compare_digest(self._mac(session_id, issued_ms, selection), mac):
            raise DryRunRefused(
                "the dry-run token is of other letters, another filter or target, or another "
                "session: run the dry run of this replay"
            )
        if issued_ms > now_ms + DRY_RUN_CLOCK_SKEW_MS:
            raise DryRunRefused("the dry-run token is from the future")
        if now_ms - issued_ms > self.ttl_ms:
            raise DryRunRefused(
                f"the dry run is older than {self.ttl_ms // 60_000} minutes: run it again"
            )


@dataclass(slots=True)
class SpentDryRuns:
    """The dry-run tokens whose replay was written, kept while they could still be taken
    (:data:`DRY_RUN_TTL_MS`): each dry run lets its replay be written once, so a confirmation
    sent twice (a double click, a browser's resend) replays nothing the second time. At most
    the replays of the last ``ttl_ms`` plus :data:`DRY_RUN_CLOCK_SKEW_MS` are kept: a token
    taken while its time lay ahead of the clock (by up to that skew) stays valid that much
    longer after it was spent."""

    ttl_ms: int = DRY_RUN_TTL_MS
    _spent: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def spend(self, token: str, now_ms: int) -> None:
        """Mark ``token`` (a valid one, issued ``<= ttl_ms`` ago) spent; raise
        :class:`DryRunRefused` if it was spent already."""
        with self._lock:
            # Forget what expired: an expired token is refused before it gets here. A token
            # is spent no earlier than DRY_RUN_CLOCK_SKEW_MS before its issue time, so it
            # expires at most ttl_ms plus that skew after it was spent.
            keep_ms = self.ttl_ms + DRY_RUN_CLOCK_SKEW_MS
            for old in [t for t, spent_ms in self._spent.items() if now_ms - spent_ms > keep_ms]:
                del self._spent[old]
            if token in self._spent:
                raise DryRunRefused(
                    "this dry run's replay was written already: run the dry run again to "
                    "replay these letters once more"
                )
            self._spent[token] = now_ms
