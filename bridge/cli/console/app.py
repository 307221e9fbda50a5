"""The console's web app: Flask views over the operator code the ``bridge`` commands use
(``bridge.cli.admin.transactions``, ``bridge.cli.admin.delays``, ``bridge.consumer.admin``,
``bridge.kafka.quarantine``, ``bridge.coordinator.health`` and the replay checks of
``bridge.cli.operators``). Views render; the reads and writes are theirs, and the dead
letters' rows, export lines and chunked replay are :mod:`bridge.cli.console.letters`'.

The module stays above 500 lines on purpose: it is one :func:`create_app`, whose views are
closures over that app's settings, its operator token and CSRF secret and the dry-run tokens it
issued and saw spent. Split into blueprints, every view module would need that state handed to
it, and the security checks each view relies on would sit away from the views."""

from __future__ import annotations

import logging
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import click
from flask import Flask, Response, abort, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from bridge.cli.admin.delays import delay_status, scan_due_times
from bridge.cli.admin.transactions import list_undecided, read_parked, resolve_parked
from bridge.cli.console.decoding import BodyDecodeError, BodyDeserializer
from bridge.cli.console.histogram import DueHistogram
from bridge.cli.console.letters import export_line, letter_row, replay_letters
from bridge.cli.console.paging import (
    Cursor,
    CursorError,
    LetterFilter,
    body_text,
    hex_dump,
    number,
    page_size,
    parse_refs,
)
from bridge.cli.console.reads import DlqPager, consumer_lag
from bridge.cli.console.security import (
    AUDIT_LOGGER,
    CSRF_FIELD,
    DRY_RUN_FIELD,
    TOKEN_HEADER,
    CsrfSigner,
    DryRunRefused,
    DryRunSigner,
    SpentDryRuns,
    WriteRefused,
    check_write,
    host_allowed,
    new_session_id,
    replay_selection,
)
from bridge.cli.operators.dead_letters import failure_fields
from bridge.cli.operators.quarantine import replay_quarantined_at
from bridge.config import ClientConfig, is_secret_property
from bridge.consumer.admin import (
    dlq_groups,
)
from bridge.consumer.send_back import ReplayTarget
from bridge.coordinator.coordinator import CoordinatorConfig, check_policy
from bridge.coordinator.health import coordinator_health
from bridge.errors import BridgeError
from bridge.kafka.quarantine import QuarantinedRecord, read_quarantine
from bridge.message import MessageConst, MessageExt
from bridge.serialization import properties_as_headers
from bridge.transaction.model import OpAction

audit = logging.getLogger(AUDIT_LOGGER)

SESSION_COOKIE: Final = "bridge_console_session"

HISTOGRAM_MAX_RECORDS: Final = 200_000
"""Waiting records the delays page's histogram counts at most (each page view reads them
again; a larger backlog is counted in part, and the page says how much)."""

QUARANTINE_READ_MS: Final = 2000
"""How long a quarantine page waits for another record once the topic went quiet, ms."""


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """What one console serves: one namespace, with or without writes."""

    client: ClientConfig
    token: str
    allow_writes: bool = False
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    """The coordinators' settings: the check policy the transactions page works out each
    next check with (as the checker does)."""
    csrf_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    allowed_hosts: frozenset[str] = frozenset()
    """Host names besides loopback's that requests may be sent to (the ``Host`` header)."""
    deserializer: BodyDeserializer | None = None
    """What a dead letter's page reads its body with besides text and hex (None: nothing)."""


def _who() -> str:
    return f"token holder at {request.remote_addr}"


def _settings_rows(config: ClientConfig) -> list[tuple[str, str]]:
    """The client settings worth showing, secret properties as ``***``."""
    rows = [
        ("bootstrap.servers", config.bootstrap_servers),
        ("namespace", config.namespace),
        ("request_timeout_ms", str(config.request_timeout_ms)),
    ]
    rows += [
        (name, "***" if is_secret_property(name) else str(value))
        for name, value in sorted(config.kafka.items())
    ]
    return rows


def create_app(settings: ConsoleSettings) -> Flask:
    """The console for ``settings.client.namespace``."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 1 << 20
    signer = CsrfSigner(settings.csrf_secret)
    dry_runs = DryRunSigner(settings.csrf_secret)
    spent = SpentDryRuns()
    config = settings.client

    @app.before_request
    def session() -> None:
        if not host_allowed(request.host, settings.allowed_hosts):
            abort(400, "unknown host: start the console with --allowed-host for this name")
        sid = request.cookies.get(SESSION_COOKIE)
        # Only a page starts a session: the stylesheet, the script and a favicon's 404 load
        # beside the first page, and a cookie of theirs would replace the page's.
        g.new_session = sid is None and request.endpoint not in (None, "static")
        g.session_id = sid or new_session_id()
        g.csrf_token = signer.token(g.session_id)
        if request.method == "POST":
            given = request.headers.get(TOKEN_HEADER) or request.form.get("token")
            try:
                check_write(
                    allow_writes=settings.allow_writes,
                    token=settings.token,
                    given_token=given,
                    signer=signer,
                    session_id=None if g.new_session else sid,
                    given_csrf=request.form.get(CSRF_FIELD) or request.headers.get("X-CSRF-Token"),
                    host_url=request.host_url,
                    origin=request.headers.get("Origin"),
                    referer=request.headers.get("Referer"),
                )
            except WriteRefused as exc:
                audit.warning(
                    "refused %s %s from %s: %s",
                    request.method,
                    request.path,
                    request.remote_addr,
                    exc.reason,
                )
                abort(Response(render_template("refused.html", reason=exc.reason), status=403))

    @app.after_request
    def headers(response: BaseResponse) -> BaseResponse:
        if g.get("new_session"):
            response.set_cookie(
                SESSION_COOKIE, g.session_id, httponly=True, samesite="Strict", path="/"
            )
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; frame-ancestors 'none'; form-action 'self'"
        )
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.context_processor
    def common() -> dict[str, Any]:
        return {
            "namespace": config.namespace,
            "writable": settings.allow_writes,
            "csrf_token": g.get("csrf_token", ""),
        }

    @app.errorhandler(BridgeError)
    def bridge_error(exc: BridgeError) -> tuple[str, int]:
        return render_template("error.html", error=f"{type(exc).__name__}: {exc}"), 502

    @app.errorhandler(CursorError)
    def bad_cursor(exc: CursorError) -> tuple[str, int]:
        return render_template("error.html", error=str(exc)), 400

    @app.get("/")
    def index() -> BaseResponse:
        return redirect(url_for("dlq"))

    # Transactions
    @app.get("/transactions")
    def transactions() -> str:
        policy = check_policy(settings.coordinator)
        undecided = list_undecided(config, policy=policy)
        by_group: dict[str, int] = Counter(t.producer_group for t in undecided)
        now = time.time_ns() // 1_000_000
        rows = [
            {
                "t": t,
                "next_check_s": _seconds_from(now, t.next_check_ms),
                "asked_s": _seconds_from(now, t.last_check_request_ms),
            }
            for t in undecided
        ]
        parked = [
            {
                "msg_id": m.msg_id,
                "transaction_id": m.transaction_id or m.msg_id,
                "group": m.get_property(MessageConst.PRODUCER_GROUP) or "",
                "topic": m.get_property(MessageConst.REAL_TOPIC) or "",
                "checks": m.get_property(MessageConst.TRANSACTION_CHECK_TIMES) or "",
                "reason": _parked_reason(m),
                "age_s": (now - m.born_timestamp_ms) / 1000,
            }
            for m in read_parked(config)
        ]
        return render_template(
            "transactions.html",
            undecided=rows,
            by_group=sorted(by_group.items()),
            parked=parked,
            check_max=policy.transaction_check_max,
            interval_s=policy.check_interval_ms / 1000,
        )

    @app.post("/transactions/resolve")
    def transactions_resolve() -> str:
        verb = request.form.get("action", "")
        actions = {"replay": OpAction.COMMIT, "drop": OpAction.ROLLBACK}
        if verb not in actions:
            abort(400, "action is replay or drop")
        action = actions[verb]
        results = []
        for msg_id in dict.fromkeys(request.form.getlist("msg_id")):
            audit.info("%s: %s parked message %s", _who(), verb, msg_id)
            try:
                resolve_parked(config, msg_id, action)
                results.append((msg_id, True, "replayed" if verb == "replay" else "dropped"))
            except BridgeError as exc:
                audit.warning("%s: %s parked message %s failed: %s", _who(), verb, msg_id, exc)
                results.append((msg_id, False, f"{type(exc).__name__}: {exc}"))
        return render_template(
            "result.html",
            title=f"Transactions: {verb}",
            results=results,
            back=url_for("transactions"),
        )

    # Delays and timers
    @app.get("/delays")
    def delays() -> str:
        queues = delay_status(config)
        now = time.time_ns() // 1_000_000
        widest = max((q.pending for q in queues), default=0) or 1
        overdue = [q for q in queues if q.pending and q.next_due_ms and q.next_due_ms < now]
        oldest = min(overdue, key=lambda q: q.next_due_ms or 0, default=None)
        histogram = DueHistogram(now)
        counted, waiting_by_offsets = scan_due_times(
            config, histogram.add, max_records=HISTOGRAM_MAX_RECORDS
        )
        return render_template(
            "delays.html",
            histogram=histogram.rows(),
            counted=counted,
            waiting_by_offsets=waiting_by_offsets,
            bucket_minutes=histogram.bucket_ms // 60_000,
            hours=histogram.bucket_ms * histogram.buckets // 3_600_000,
            queues=[
                {
                    "q": q,
                    "width": round(100 * q.pending / widest),
                    "due_s": None if not q.next_due_ms else (q.next_due_ms - now) / 1000,
                }
                for q in queues
                if q.kind == "level" or q.pending
            ],
            waiting=sum(q.pending for q in queues),
            oldest=oldest,
            oldest_overdue_s=None if oldest is None else (now - (oldest.next_due_ms or now)) / 1000,
        )

    # Dead letters
    @app.get("/dlq")
    def dlq() -> str:
        groups = []
        for group in dlq_groups(config):
            with DlqPager(config, group) as pager:
                groups.append((group, pager.total))
        return render_template("dlq_groups.html", groups=groups)

    def _filter() -> LetterFilter:
        source = request.form if request.method == "POST" else request.args
        return LetterFilter.parse(source.get("keys"), source.get("tags"), source.get("ids"))

    @app.get("/dlq/<group>")
    def dlq_group(group: str) -> str:
        _require_group(group)
        letter_filter = _filter()
        size = page_size(request.args.get("size"))
        cursor = Cursor.decode(request.args.get("cursor"))
        with DlqPager(config, group) as pager:
            page = pager.page(cursor, size, None if letter_filter.empty else letter_filter)
        return render_template(
            "dlq.html",
            group=group,
            letters=[letter_row(letter) for letter in page.letters],
            page=page,
            size=size,
            cursor=cursor.encode(),
            filter=letter_filter,
            next_url=None
            if page.next is None
            else url_for(
                "dlq_group",
                group=group,
                cursor=page.next.encode(),
                size=size,
                **letter_filter.query(),
            ),
            first_url=url_for("dlq_group", group=group, size=size, **letter_filter.query()),
            export_url=url_for("dlq_export", group=group, **letter_filter.query()),
            targets=[t.value for t in ReplayTarget],
        )

    @app.get("/dlq/<group>/letter/<int:partition>/<int:offset>")
    def dlq_letter(group: str, partition: int, offset: int) -> str:
        _require_group(group)
        with DlqPager(config, group) as pager:
            found = pager.letters_at([(partition, offset)])
        if not found:
            abort(404)
        letter = found[0]
        view = "hex" if request.args.get("view") == "hex" else "text"
        text, utf8 = body_text(letter.message.body)
        decoded = decode_error = None
        if settings.deserializer is not None:
            m = letter.message
            try:
                decoded = settings.deserializer.decode(
                    m.body,
                    str(m.get_property(MessageConst.RETRY_TOPIC) or m.topic),
                    list(properties_as_headers(m.properties)),
                )
            except BodyDecodeError as exc:
                decode_error = str(exc)
        return render_template(
            "letter.html",
            group=group,
            row=letter_row(letter),
            failure=failure_fields(letter.message),
            properties=sorted(
                (k, v if isinstance(v, str) else repr(v))
                for k, v in letter.message.properties.items()
            ),
            view=view,
            body=hex_dump(letter.message.body) if view == "hex" else text,
            utf8=utf8,
            deserializer=None if settings.deserializer is None else settings.deserializer.name,
            decoded=decoded,
            decode_error=decode_error,
        )

    @app.get("/dlq/<group>/export.jsonl")
    def dlq_export(group: str) -> Response:
        _require_group(group)
        letter_filter = _filter()

        def lines() -> Iterator[str]:
            with DlqPager(config, group) as pager:
                ends = {p: high for p, (_, high) in pager.ranges.items()}
                for chunk in pager.scan(None if letter_filter.empty else letter_filter, 500, ends):
                    for letter in chunk:
                        yield export_line(letter) + "\n"

        return Response(
            lines(),
            mimetype="application/x-ndjson",
            headers={"Content-Disposition": f'attachment; filename="dlq-{group}.jsonl"'},
        )

    @app.post("/dlq/<group>/replay")
    def dlq_replay(group: str) -> BaseResponse | str:
        dry_run = request.form.get("mode") != "write"
        try:
            target = ReplayTarget(request.form.get("target", ReplayTarget.ORIGIN.value))
        except ValueError:
            abort(400, "target is origin or retry")
        scope = "selected" if request.form.get("scope", "selected") == "selected" else "filtered"
        letter_filter = _filter()
        refs = parse_refs(request.form.getlist("ref"))
        what = (
            f"{'dry run of ' if dry_run else ''}replay of dead letters of {group} to "
            f"{target.value}: "
            + (
                f"letters {', '.join(f'{p}@{o}' for p, o in refs)}"
                if scope == "selected"
                else f"filter {letter_filter.query() or 'none (all)'}"
            )
        )
        # A replay writes only what a dry run of the same letters showed, in this session,
        # minutes ago: checked before any Kafka call. A filtered replay reads the queue up to
        # where its dry run read it (the ends it signed), never letters that came later.
        pinned = Cursor.decode(request.form.get("ends")).positions
        if not dry_run:
            try:
                now = time.time_ns() // 1_000_000
                given_dry_run = request.form.get(DRY_RUN_FIELD)
                dry_runs.check(
                    g.session_id,
                    _selection(
                        group,
                        target,
                        scope=scope,
                        refs=refs,
                        letter_filter=letter_filter,
                        ends=dict(pinned),
                    ),
                    given_dry_run,
                    now,
                )
                spent.spend(given_dry_run or "", now)
            except DryRunRefused as exc:
                audit.warning("%s: refused %s: %s", _who(), what, exc.reason)
                return Response(render_template("refused.html", reason=exc.reason), status=409)
        _require_group(group)
        audit.info("%s: %s", _who(), what)
        report, ends = replay_letters(
            config,
            group,
            refs if scope == "selected" else None,
            letter_filter,
            target,
            dry_run=dry_run,
            pinned=None if dry_run else dict(pinned),
        )
        audit.info(
            "%s: %s done: %d chosen, %d %s, %d failed%s",
            _who(),
            what,
            report.chosen,
            report.replayed,
            "replayable" if dry_run else "replayed",
            report.failed,
            f" ({report.error})" if report.error else "",
        )
        dry_run_token = None
        if dry_run and report.replayed and report.error is None:
            dry_run_token = dry_runs.token(
                g.session_id,
                _selection(
                    group, target, scope=scope, refs=refs, letter_filter=letter_filter, ends=ends
                ),
                time.time_ns() // 1_000_000,
            )
        return render_template(
            "replay.html",
            group=group,
            report=report,
            dry_run=dry_run,
            dry_run_token=dry_run_token,
            ttl_minutes=dry_runs.ttl_ms // 60_000,
            target=target.value,
            scope=scope,
            refs=[f"{p}@{o}" for p, o in refs],
            ends=Cursor(ends).encode(),
            filter=letter_filter,
        )

    def _require_group(group: str) -> None:
        if group not in dlq_groups(config):
            abort(404, f"consumer group {group!r} has no dead-letter queue")

    # Quarantine
    @app.get("/quarantine")
    def quarantine() -> str:
        start = number(request.args.get("from")) or 0
        size = page_size(request.args.get("size"))
        counts: Counter[tuple[str, str]] = Counter()
        records: list[QuarantinedRecord] = []
        next_from = None
        for kept in read_quarantine(config, timeout_ms=QUARANTINE_READ_MS):
            key = (kept.source_topic, kept.reason)
            if key in counts or len(counts) < 200:
                counts[key] += 1
            if kept.offset >= start:
                if len(records) < size:
                    records.append(kept)
                elif next_from is None:
                    next_from = kept.offset
        return render_template(
            "quarantine.html",
            counts=counts.most_common(),
            records=records,
            next_url=None
            if next_from is None
            else url_for("quarantine", size=size, **_from(next_from)),
        )

    @app.post("/quarantine/replay")
    def quarantine_replay() -> str:
        results = []
        for value in dict.fromkeys(request.form.getlist("offset")):
            offset = number(value)
            if offset is None:
                results.append((value[:40], False, "not an offset"))
                continue
            audit.info("%s: replay quarantined record at offset %d", _who(), offset)
            try:
                done = replay_quarantined_at(config, offset)
                results.append(
                    (
                        value,
                        True,
                        f"replayed {done.msg_id} to {done.topic}[{done.partition}]@{done.offset}",
                    )
                )
            except (BridgeError, click.ClickException) as exc:  # NotFoundError is a click one
                audit.warning("%s: replay of quarantined offset %d failed: %s", _who(), offset, exc)
                results.append((value, False, f"{type(exc).__name__}: {exc}"))
        return render_template(
            "result.html", title="Quarantine: replay", results=results, back=url_for("quarantine")
        )

    # Health
    @app.get("/health")
    def health() -> str:
        services = coordinator_health(config)
        lags = consumer_lag(config)
        return render_template(
            "health.html",
            services=services,
            healthy=all(s.healthy for s in services),
            lags=lags,
            settings=_settings_rows(config),
        )

    return app


def _from(offset: int) -> dict[str, Any]:
    """The quarantine page's ``from`` query field (a Python keyword)."""
    return {"from": offset}


def _selection(
    group: str,
    target: ReplayTarget,
    *,
    scope: str,
    refs: list[tuple[int, int]],
    letter_filter: LetterFilter,
    ends: dict[int, int],
) -> str:
    """What a replay of these form fields writes, as its dry-run token signs it."""
    return replay_selection(
        group=group,
        target=target.value,
        scope=scope,
        refs=refs,
        keys=letter_filter.keys,
        tags=letter_filter.tags,
        msg_ids=letter_filter.msg_ids,
        ends=ends,
    )


def _seconds_from(now_ms: int, when_ms: int | None) -> float | None:
    """Seconds from ``now_ms`` to ``when_ms`` (negative: past; None when unknown)."""
    return None if when_ms is None else (when_ms - now_ms) / 1000


def _parked_reason(msg: MessageExt) -> str:
    error = msg.get_property(MessageConst.DELIVERY_ERROR)
    if error:
        attempts = msg.get_property(MessageConst.DELIVERY_ATTEMPTS) or "?"
        return f"delivery failed {attempts} times: {error}"
    checks = msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES)
    return f"no decision after {checks} checks" if checks else "check-max"


__all__ = ["ConsoleSettings", "create_app"]
