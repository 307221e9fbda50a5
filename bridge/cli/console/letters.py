"""Dead letters as the console shows, exports and replays them: a letter's row on the DLQ
pages, its line in an export, and a replay in chunks with the code of ``bridge dlq replay``
(its target check before anything is written, then
:func:`~bridge.consumer.admin.write_back`), reported in a :class:`ReplayReport`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from bridge.cli.console.paging import LetterFilter
from bridge.cli.console.reads import DlqPager, Letter
from bridge.cli.operators.dead_letters import failure_fields, require_replay_targets
from bridge.cli.output import message_json
from bridge.config import ClientConfig
from bridge.consumer.admin import (
    REPLAY_CHUNK,
    DeadLetterReplayError,
    ReplayFailure,
    prepare_replay,
    write_back,
)
from bridge.consumer.send_back import ReplayTarget
from bridge.errors import BridgeError
from bridge.message import MessageConst, MessageExt

MAX_REPORTED_FAILURES: Final = 100
"""Letters a replay's report names with their reason; the rest are counted."""
SAMPLE_ROWS: Final = 50
"""Letters a replay's report shows."""


def letter_row(letter: Letter) -> dict[str, Any]:
    """One letter as the DLQ pages show it."""
    m = letter.message
    failure = failure_fields(m)
    why = failure[MessageConst.CONSUME_FAILURE] or ""
    cls = failure[MessageConst.CONSUME_EXCEPTION_CLASS]
    return {
        "ref": letter.ref,
        "partition": letter.partition,
        "offset": letter.offset,
        "msg_id": m.msg_id,
        "origin_id": m.get_property(MessageConst.ORIGIN_MESSAGE_ID) or "",
        "origin_topic": m.get_property(MessageConst.RETRY_TOPIC) or "",
        "keys_text": " ".join(m.keys),
        "tags": m.tags or "",
        "reconsume_times": m.reconsume_times,
        "failure_class": cls or "",
        "failure_message": failure[MessageConst.CONSUME_EXCEPTION_MESSAGE] or ("" if cls else why),
        "body_bytes": len(m.body),
        "born_ms": m.born_timestamp_ms,
    }


def export_line(letter: Letter) -> str:
    """One letter as ``bridge dlq list --json`` writes it, plus its place in the DLQ."""
    m = letter.message
    return json.dumps(
        {
            "msg_id": m.msg_id,
            "origin_topic": m.get_property(MessageConst.RETRY_TOPIC),
            "origin_message_id": m.get_property(MessageConst.ORIGIN_MESSAGE_ID),
            "failures": m.reconsume_times,
            "failure": failure_fields(m),
            "message": message_json(m),
            "dlq_partition": letter.partition,
            "dlq_offset": letter.offset,
        },
        ensure_ascii=False,
    )


@dataclass(slots=True)
class ReplayReport:
    """What a replay of dead letters did (or, dry, would do)."""

    chosen: int = 0
    replayed: int = 0
    failures: list[ReplayFailure] = field(default_factory=list)
    failed: int = 0
    sample: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def add_failures(self, failed: list[ReplayFailure]) -> None:
        self.failed += len(failed)
        room = MAX_REPORTED_FAILURES - len(self.failures)
        self.failures.extend(failed[: max(room, 0)])


def _replay_chunk(
    config: ClientConfig,
    group: str,
    letters: list[MessageExt],
    target: ReplayTarget,
    report: ReplayReport,
    *,
    dry_run: bool,
) -> None:
    """Replay (or try, dry) one chunk with the code of ``bridge dlq replay``: its target
    check before anything is written, then :func:`write_back`."""
    report.chosen += len(letters)
    if dry_run:
        built, failed = prepare_replay(letters, group, target, namespace=config.namespace)
        report.replayed += len(built)
        report.add_failures(failed)
        return
    require_replay_targets(config, group, letters, target)
    try:
        report.replayed += len(write_back(config, group, letters, target))
    except DeadLetterReplayError as exc:
        report.replayed += len(exc.replayed)
        report.add_failures(exc.failed)


def replay_letters(
    config: ClientConfig,
    group: str,
    refs: list[tuple[int, int]] | None,
    letter_filter: LetterFilter,
    target: ReplayTarget,
    *,
    dry_run: bool,
    pinned: dict[int, int] | None = None,
) -> tuple[ReplayReport, dict[int, int]]:
    """Replay (or try, dry) the dead letters of ``group`` at ``refs`` ((partition, offset)
    pairs), or with ``refs`` None every letter that ``letter_filter`` takes, in chunks of
    :data:`~bridge.consumer.admin.REPLAY_CHUNK`; an error ends the replay and is reported.
    A filtered replay reads each partition up to ``pinned`` (the ends its dry run read to; a
    partition not named: none of it), or with ``pinned`` None up to the DLQ's end now.
    Returns the report and the ends read up to (empty for ``refs``)."""
    report = ReplayReport()
    ends: dict[int, int] = {}
    with DlqPager(config, group) as pager:
        try:
            if refs is not None:
                letters = pager.letters_at(refs)
                report.sample = [letter_row(x) for x in letters]
                _replay_chunk(
                    config, group, [x.message for x in letters], target, report, dry_run=dry_run
                )
            else:
                ends = (
                    {p: high for p, (_, high) in pager.ranges.items()}
                    if pinned is None
                    else {p: pinned.get(p, low) for p, (low, _) in pager.ranges.items()}
                )
                chosen = None if letter_filter.empty else letter_filter
                for chunk in pager.scan(chosen, REPLAY_CHUNK, ends):
                    room = SAMPLE_ROWS - len(report.sample)
                    report.sample.extend(letter_row(x) for x in chunk[: max(room, 0)])
                    _replay_chunk(
                        config,
                        group,
                        [x.message for x in chunk],
                        target,
                        report,
                        dry_run=dry_run,
                    )
        except BridgeError as exc:
            report.error = f"{type(exc).__name__}: {exc}"
    return report, ends
