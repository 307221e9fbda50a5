"""Send ids (``BRIDGE_SEND_ID``): the format ``uuid.uuid4().hex`` gave, unique in a process,
from thread to thread, and in a forked child."""

from __future__ import annotations

import os
import re
import threading
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.message_id import SendIdGenerator, fresh_send_id

UUID4_HEX = re.compile(rb"^[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}$")


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=1, max_value=2_000))
def test_ids_are_version_4_uuid_hex_and_never_repeat(count: int) -> None:
    gen = SendIdGenerator()
    ids = [gen.next_id() for _ in range(count)]
    assert len(set(ids)) == count
    for sent in ids:
        assert UUID4_HEX.match(sent), sent
        parsed = uuid.UUID(sent.decode("ascii"))
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_two_generators_draw_different_prefixes() -> None:
    # Two processes each draw their prefix: 74 random bits, so two never start alike.
    prefixes = {SendIdGenerator().next_id()[:20] for _ in range(200)}
    assert len(prefixes) == 200


def test_ids_from_many_threads_never_repeat() -> None:
    seen: list[bytes] = []
    lock = threading.Lock()

    def draw() -> None:
        mine = [fresh_send_id() for _ in range(5_000)]
        with lock:
            seen.extend(mine)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == len(seen) == 20_000


def test_a_forked_child_draws_its_own_prefix() -> None:
    parent = fresh_send_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.write(write, fresh_send_id())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64)
    os.close(read)
    os.waitpid(pid, 0)
    assert UUID4_HEX.match(child)
    # The parent's next id continues its own counter; the child's came from a new prefix.
    assert child[:20] != parent[:20]
    assert fresh_send_id()[:20] == parent[:20]
