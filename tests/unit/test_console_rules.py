"""The console's pure rules: cursors and page sizes, letter references and filters, body
views, the operator token, CSRF tokens and the same-origin check, and how the app applies
them to a write before any Kafka call (its refusals need no broker)."""

from __future__ import annotations

import sys
import time

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from bridge.cli import cli
from bridge.cli.console import ConsoleUnavailableError, require_flask
from bridge.cli.console.app import ConsoleSettings, create_app
from bridge.cli.console.histogram import DueHistogram
from bridge.cli.console.paging import (
    DEFAULT_PAGE_SIZE,
    HEX_PREVIEW_BYTES,
    MAX_PAGE_SIZE,
    Cursor,
    CursorError,
    LetterFilter,
    body_text,
    hex_dump,
    number,
    page_size,
    parse_refs,
)
from bridge.cli.console.security import (
    DRY_RUN_TTL_MS,
    CsrfSigner,
    DryRunRefused,
    DryRunSigner,
    SpentDryRuns,
    WriteRefused,
    check_write,
    host_allowed,
    replay_selection,
    same_origin,
    token_matches,
)
from bridge.config import ClientConfig
from bridge.message import MessageConst, MessageExt

positions = st.dictionaries(st.integers(0, 10_000), st.integers(0, 2**62), max_size=20)


@given(positions)
def test_a_cursor_survives_its_url(given_positions: dict[int, int]) -> None:
    cursor = Cursor(given_positions)
    assert Cursor.decode(cursor.encode()).positions == given_positions


@given(st.text(max_size=40))
def test_a_cursor_from_any_text_is_one_it_could_have_written_or_refused(text: str) -> None:
    try:
        cursor = Cursor.decode(text)
    except CursorError:
        return
    assert all(p >= 0 and o >= 0 for p, o in cursor.positions.items())
    assert Cursor.decode(cursor.encode()) == cursor


@pytest.mark.parametrize("text", ["0:1,0:2", "-1:3", "0:-3", "a:b", "1", "0:1,", "٣:1"])
def test_cursors_that_are_refused(text: str) -> None:
    with pytest.raises(CursorError):
        Cursor.decode(text)


@given(positions, st.integers(0, 10_000), st.integers(0, 2**62))
def test_a_cursor_never_starts_below_the_retained_range(
    given_positions: dict[int, int], partition: int, low: int
) -> None:
    start = Cursor(given_positions).start(partition, low)
    assert start >= low
    assert start == max(given_positions.get(partition, low), low)


@given(st.one_of(st.none(), st.text(max_size=12), st.integers().map(str)))
def test_a_page_size_is_always_within_bounds(text: str | None) -> None:
    assert 1 <= page_size(text) <= MAX_PAGE_SIZE


def test_page_sizes() -> None:
    assert page_size(None) == page_size("x") == DEFAULT_PAGE_SIZE
    assert page_size("0") == 1 and page_size("7") == 7 and page_size("100000") == MAX_PAGE_SIZE


def test_letter_references() -> None:
    assert parse_refs(["0@5", "2@7", "0@5"]) == [(0, 5), (2, 7)]
    for bad in ("5", "a@1", "1@-2", "1@²"):
        with pytest.raises(CursorError):
            parse_refs([bad])


def _letter(msg_id: str, keys: str, tags: str | None, origin_id: str | None = None) -> MessageExt:
    msg = MessageExt(topic="t", body=b"x", keys=keys, tags=tags, msg_id=msg_id)
    if origin_id:
        msg.put_system_property(MessageConst.ORIGIN_MESSAGE_ID, origin_id)
    return msg


def test_a_filter_chooses_as_dlq_replay_does() -> None:
    f = LetterFilter.parse("k1, k2", "TagA", "")
    assert f.keys == ("k1", "k2") and f.tags == ("TagA",) and f.msg_ids == ()
    assert f.matches(_letter("A", "k2 other", "TagA"))
    assert not f.matches(_letter("A", "k3", "TagA"))
    assert not f.matches(_letter("A", "k1", "TagB"))
    by_id = LetterFilter.parse(None, None, "ORIGIN-1")
    assert by_id.matches(_letter("RETRY-COPY", "", None, origin_id="ORIGIN-1"))
    assert LetterFilter().empty and LetterFilter().matches(_letter("A", "", None))
    assert f.query() == {"keys": "k1 k2", "tags": "TagA"}


@given(st.binary(max_size=300))
def test_a_hex_view_shows_every_byte_in_order(body: bytes) -> None:
    dump = hex_dump(body)
    hexes = "".join(line[10:57].replace(" ", "") for line in dump.splitlines())
    assert bytes.fromhex(hexes) == body


def test_a_hex_view_of_a_large_body_is_cut() -> None:
    dump = hex_dump(bytes(HEX_PREVIEW_BYTES + 5))
    assert dump.endswith("... 5 more bytes")


def test_body_text_says_when_a_body_is_not_utf8() -> None:
    assert body_text("héllo".encode()) == ("héllo", True)
    assert body_text(b"\xff\xfeok") == ("\ufffd\ufffdok", False)


@given(st.text(min_size=1, max_size=40), st.text(max_size=40))
def test_only_the_token_itself_matches(token: str, other: str) -> None:
    assert token_matches(token, token)
    assert token_matches(token, other) is (other == token)
    assert not token_matches(token, None) and not token_matches(token, "")


@given(st.binary(min_size=16, max_size=32), st.text(min_size=1), st.text(min_size=1))
def test_a_csrf_token_is_worth_nothing_in_another_session(
    secret: bytes, session: str, other: str
) -> None:
    signer = CsrfSigner(secret)
    token = signer.token(session)
    assert signer.valid(session, token)
    assert signer.valid(other, token) is (other == session)
    assert not CsrfSigner(secret + b"x").valid(session, token)
    assert not signer.valid(None, token) and not signer.valid(session, None)


hosts = st.sampled_from(["127.0.0.1", "localhost", "[::1]", "console.example"])
ports = st.integers(1, 65535)


@given(hosts, ports, ports, st.sampled_from(["http", "https"]))
def test_same_origin_means_scheme_host_and_port(
    host: str, port: int, other: int, scheme: str
) -> None:
    own = f"{scheme}://{host}:{port}/"
    assert same_origin(own, f"{scheme}://{host}:{port}", None)
    assert same_origin(own, None, f"{scheme}://{host}:{port}/dlq/g?x=1")
    assert same_origin(own, f"{scheme}://{host}:{other}", None) is (other == port)
    assert not same_origin(own, f"{scheme}://evil.example:{port}", None)
    assert not same_origin(own, None, None)
    # A page of another origin that sends no Origin header is judged by its Referer.
    assert not same_origin(own, "null", "http://evil.example/")
    # The Origin header wins over a Referer that would pass.
    assert not same_origin(own, "http://evil.example", own)


def _check(**changes: object) -> None:
    signer = CsrfSigner(b"s" * 32)
    args: dict[str, object] = {
        "allow_writes": True,
        "token": "the-operator-token",
        "given_token": "the-operator-token",
        "signer": signer,
        "session_id": "session-1",
        "given_csrf": signer.token("session-1"),
        "host_url": "http://127.0.0.1:8089/",
        "origin": "http://127.0.0.1:8089",
        "referer": None,
    }
    args.update(changes)
    check_write(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"allow_writes": False}, "read-only"),
        ({"given_token": None}, "operator token"),
        ({"given_token": "the-operator-token!"}, "operator token"),
        ({"given_csrf": None}, "CSRF"),
        ({"session_id": "session-2"}, "CSRF"),
        ({"session_id": None}, "CSRF"),
        ({"origin": "http://127.0.0.1:8090"}, "cross-origin"),
        ({"origin": None, "referer": None}, "cross-origin"),
    ],
)
def test_a_write_needs_every_check(changes: dict[str, object], reason: str) -> None:
    _check()
    with pytest.raises(WriteRefused, match=reason):
        _check(**changes)


UNREACHABLE = ClientConfig(bootstrap_servers="127.0.0.1:1", namespace="unit")


def _client(allow_writes: bool = True) -> object:
    app = create_app(ConsoleSettings(UNREACHABLE, "the-operator-token-xyz", allow_writes))
    return app.test_client()


def test_the_app_refuses_writes_before_anything_reaches_kafka() -> None:
    client = _client()
    page = client.get("/static/console.css")  # type: ignore[attr-defined]
    assert page.status_code == 200
    assert "bridge_console_session" not in page.headers.get("Set-Cookie", "")
    for headers, form, reason in [
        ({}, {}, "missing or wrong operator token"),
        ({"X-Console-Token": "the-operator-token-xyz"}, {}, "missing or wrong CSRF token"),
        ({}, {"token": "wrong"}, "missing or wrong operator token"),
    ]:
        refused = client.post("/transactions/resolve", headers=headers, data=form)  # type: ignore[attr-defined]
        assert refused.status_code == 403, refused.data
        assert reason in refused.get_data(as_text=True)
    read_only = _client(allow_writes=False)
    refused = read_only.post(  # type: ignore[attr-defined]
        "/transactions/resolve", headers={"X-Console-Token": "the-operator-token-xyz"}
    )
    assert refused.status_code == 403 and "read-only" in refused.get_data(as_text=True)


def test_console_pages_set_a_strict_http_only_session_cookie_and_a_strict_policy() -> None:
    response = _client().get("/")  # type: ignore[attr-defined]
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]


def test_without_the_extra_the_command_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flask", None)
    with pytest.raises(ConsoleUnavailableError, match="'console' extra"):
        require_flask()
    result = CliRunner().invoke(cli, ["console", "-b", "127.0.0.1:1"])
    assert result.exit_code == 1
    assert "Error: ConsoleUnavailableError: bridge console needs the 'console' extra" in (
        result.output
    )


def test_bridge_imports_without_the_console_extra() -> None:
    import subprocess

    code = (
        "import sys; sys.modules['flask'] = None; sys.modules['werkzeug'] = None\n"
        "import bridge, bridge.cli, bridge.cli.console\n"
        "assert 'jinja2' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_write_that_passes_every_check_reaches_its_view() -> None:
    """The token, the session's CSRF token and the console's own origin let a write through
    (here to a view that refuses an unknown action before any Kafka call)."""
    secret = b"k" * 32
    app = create_app(
        ConsoleSettings(UNREACHABLE, "the-operator-token-xyz", True, csrf_secret=secret)
    )
    client = app.test_client()
    session = client.get("/").headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    form = {"token": "the-operator-token-xyz", "csrf_token": CsrfSigner(secret).token(session)}
    passed = client.post(
        "/transactions/resolve",
        data={**form, "action": "commit-everything"},
        headers={"Origin": "http://localhost"},
    )
    assert passed.status_code == 400 and "action is replay or drop" in passed.get_data(True)
    cross = client.post(
        "/transactions/resolve", data=form, headers={"Origin": "http://localhost:1"}
    )
    assert cross.status_code == 403


def test_only_requests_sent_to_the_console_s_own_names_are_served() -> None:
    assert host_allowed("127.0.0.1:8089", frozenset())
    assert host_allowed("localhost", frozenset()) and host_allowed("[::1]:80", frozenset())
    assert host_allowed("console.internal:8089", frozenset({"console.internal"}))
    assert not host_allowed("evil.example:8089", frozenset({"console.internal"}))
    assert not host_allowed(None, frozenset()) and not host_allowed("", frozenset())
    rebound = _client().get("/", headers={"Host": "evil.example:8089"})  # type: ignore[attr-defined]
    assert rebound.status_code == 400


def _selection(**changes: object) -> str:
    fields: dict[str, object] = {
        "group": "billing",
        "target": "origin",
        "scope": "filtered",
        "refs": [],
        "keys": ("k1", "k2"),
        "tags": (),
        "msg_ids": (),
        "ends": {0: 10, 1: 7},
    }
    fields.update(changes)
    return replay_selection(**fields)  # type: ignore[arg-type]


def test_a_replay_selection_names_what_is_written_and_nothing_else() -> None:
    assert _selection(keys=("k2", "k1", "k1")) == _selection()  # terms are a set
    assert _selection(ends={1: 7, 0: 10}) == _selection()
    changes: list[dict[str, object]] = [
        {"group": "other"},
        {"target": "retry"},
        {"keys": ("k1",)},
        {"tags": ("k1", "k2")},  # the same terms in another field
        {"ends": {0: 11, 1: 7}},  # letters that arrived after the dry run
        {"scope": "selected"},
    ]
    for change in changes:
        assert _selection(**change) != _selection(), change
    selected: dict[str, object] = {"scope": "selected", "ends": {}}
    assert _selection(**selected, refs=[(1, 2), (0, 5)]) == _selection(
        **selected, refs=[(0, 5), (1, 2), (0, 5)]
    )
    assert _selection(**selected, refs=[(0, 5)]) != _selection(**selected, refs=[(0, 6)])


@given(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30), st.text(max_size=60))
def test_a_dry_run_token_is_worth_nothing_for_other_letters_or_sessions(
    session: str, other: str, selection: str
) -> None:
    signer = DryRunSigner(b"s" * 32)
    token = signer.token(session, selection, 1_000_000)
    signer.check(session, selection, token, 1_000_000 + DRY_RUN_TTL_MS)
    if other != session:
        with pytest.raises(DryRunRefused, match="another session"):
            signer.check(other, selection, token, 1_000_000)
    with pytest.raises(DryRunRefused, match="other letters"):
        signer.check(session, selection + "x", token, 1_000_000)
    with pytest.raises(DryRunRefused):
        DryRunSigner(b"t" * 32).check(session, selection, token, 1_000_000)  # a restart


def test_a_dry_run_token_expires_and_needs_its_own_time() -> None:
    signer = DryRunSigner(b"s" * 32)
    token = signer.token("sid", "sel", 5_000_000)
    with pytest.raises(DryRunRefused, match="older than 10 minutes"):
        signer.check("sid", "sel", token, 5_000_001 + DRY_RUN_TTL_MS)
    with pytest.raises(DryRunRefused, match="future"):
        signer.check("sid", "sel", token, 5_000_000 - 60_000)
    # Another time with the same MAC: the time is signed too.
    mac = token.split(".", 1)[1]
    with pytest.raises(DryRunRefused, match="other letters"):
        signer.check("sid", "sel", f"5000001.{mac}", 5_000_001)
    for bad in [None, "", "abc", "12", ".abc", "x1.abc", "١٢.abc"]:
        with pytest.raises(DryRunRefused):
            signer.check("sid", "sel", bad, 5_000_000)
    # Not a CSRF token either (an HMAC of the bare session id under the same secret).
    with pytest.raises(DryRunRefused):
        signer.check("sid", "sel", f"5000000.{CsrfSigner(b's' * 32).token('sid')}", 5_000_000)


def test_a_write_replay_without_its_dry_run_is_refused_before_kafka() -> None:
    """The operator token, CSRF and origin all pass; the missing (or foreign) dry-run token
    alone refuses the replay with 409, before any Kafka call (the broker is unreachable)."""
    secret = b"k" * 32
    app = create_app(
        ConsoleSettings(UNREACHABLE, "the-operator-token-xyz", True, csrf_secret=secret)
    )
    client = app.test_client()
    session = client.get("/").headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    form = {
        "token": "the-operator-token-xyz",
        "csrf_token": CsrfSigner(secret).token(session),
        "mode": "write",
        "scope": "selected",
        "ref": "0@0",
        "target": "origin",
    }
    origin = {"Origin": "http://localhost"}
    refused = client.post("/dlq/billing/replay", data=form, headers=origin)
    assert refused.status_code == 409 and "no dry run" in refused.get_data(True)
    other = DryRunSigner(secret).token(
        session,
        replay_selection(
            group="billing", target="origin", scope="selected", refs=[(0, 1)],
            keys=(), tags=(), msg_ids=(), ends={},
        ),
        time.time_ns() // 1_000_000,
    )  # fmt: skip
    foreign = client.post(
        "/dlq/billing/replay", data={**form, "dry_run_token": other}, headers=origin
    )
    assert foreign.status_code == 409 and "other letters" in foreign.get_data(True)


@given(st.integers(0, 2**40), st.lists(st.integers(-(2**40), 2**41), max_size=200))
def test_a_due_histogram_counts_each_record_once_in_its_bucket(now: int, dues: list[int]) -> None:
    histogram = DueHistogram(now, bucket_ms=600_000, buckets=36)
    for due in dues:
        histogram.add(due)
    assert histogram.total == len(dues)
    assert histogram.overdue == sum(d < now for d in dues)
    assert histogram.later == sum(d >= now + 36 * 600_000 for d in dues)
    for i, n in enumerate(histogram.counts):
        assert n == sum(now + i * 600_000 <= d < now + (i + 1) * 600_000 for d in dues)
    rows = histogram.rows()
    assert len(rows) == 38 and [n for _, n, _ in rows] == [
        histogram.overdue,
        *histogram.counts,
        histogram.later,
    ]
    assert all(0 <= width <= 100 for _, _, width in rows)


def test_due_histogram_labels() -> None:
    histogram = DueHistogram(0)
    histogram.add(25 * 60_000)
    histogram.add(7 * 3_600_000)
    labels = [label for label, _, _ in histogram.rows()]
    assert labels[:3] == ["overdue", "+0:00-0:10", "+0:10-0:20"]
    assert labels[-1] == "later than +6:00"
    assert dict((label, n) for label, n, _ in histogram.rows())["+0:20-0:30"] == 1
    assert histogram.later == 1
    with pytest.raises(ValueError, match="positive width"):
        DueHistogram(0, bucket_ms=0)


def test_a_dry_run_s_replay_is_written_once() -> None:
    spent = SpentDryRuns(ttl_ms=1000)
    spent.spend("a", 0)
    spent.spend("b", 10)
    with pytest.raises(DryRunRefused, match="written already"):
        spent.spend("a", 500)
    # Past the time a token could be taken at all, it is forgotten (the signer refuses it):
    # its time to live, and the clock skew the signer allows, after it was spent.
    spent.spend("c", 6_005)
    assert set(spent._spent) == {"b", "c"}  # what it keeps is the point


def test_a_token_from_ahead_of_the_clock_is_remembered_while_it_is_valid() -> None:
    # The signer takes a token whose time lies up to DRY_RUN_CLOCK_SKEW_MS ahead (the clock
    # moved back): it is valid until its own time plus the ttl, so SpentDryRuns must keep it
    # that long after spending it, or its replay can be written again.
    signer, spent = DryRunSigner(b"s" * 32, ttl_ms=1000), SpentDryRuns(ttl_ms=1000)
    token = signer.token("session", "selection", 10_000)
    signer.check("session", "selection", token, 5_000)
    spent.spend(token, 5_000)
    for now in (6_001, 10_999):
        signer.check("session", "selection", token, now)  # still valid
        with pytest.raises(DryRunRefused, match="written already"):
            spent.spend(token, now)


def test_a_dry_run_token_has_one_text_so_its_replay_is_written_once() -> None:
    # Leading zeros name the same issue time to the MAC; taken, they would be a token the
    # spent set has not seen, and the dry run's replay would be written a second time.
    signer = DryRunSigner(b"s" * 32)
    token = signer.token("session", "selection", 1_000_000)
    signer.check("session", "selection", token, 1_000_100)
    for variant in (f"0{token}", f"00{token}"):
        with pytest.raises(DryRunRefused, match="malformed"):
            signer.check("session", "selection", variant, 1_000_200)


def test_numbers_from_urls_and_forms_are_bounded() -> None:
    # Python refuses to convert a text of more than 4,300 digits (ValueError), and Kafka's
    # offsets are 64-bit: such a number is refused as the text it is, never a 500.
    huge = "9" * 5000
    assert number(huge) is None and number(str(2**63)) is None and number("²") is None
    assert number(str(2**63 - 1)) == 2**63 - 1 and number("0") == 0
    with pytest.raises(CursorError):
        parse_refs([f"0@{huge}"])
    with pytest.raises(CursorError):
        Cursor.decode(f"0:{huge}")
    with pytest.raises(DryRunRefused, match="malformed"):
        DryRunSigner(b"s" * 32).check("session", "selection", f"{huge}.00", 1_000)


def test_a_huge_number_in_a_page_s_url_or_a_form_is_no_server_error() -> None:
    secret = b"k" * 32
    app = create_app(
        ConsoleSettings(UNREACHABLE, "the-operator-token-xyz", True, csrf_secret=secret)
    )
    client = app.test_client()
    session = client.get("/").headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    # Read past the number: the page then asks the unreachable Kafka (502), not a 500.
    assert client.get(f"/quarantine?from={'9' * 5000}").status_code == 502
    form = {"token": "the-operator-token-xyz", "csrf_token": CsrfSigner(secret).token(session)}
    replay = client.post(
        "/quarantine/replay",
        data={**form, "offset": "9" * 5000},
        headers={"Origin": "http://localhost"},
    )
    assert replay.status_code == 200 and "not an offset" in replay.get_data(True)
