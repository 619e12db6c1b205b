"""How a replayed dead letter is marked, so that only the group that failed it runs it.

A replay is a new message in the original topic, appended at the end of the log, with
the dead letter's key, payload and headers plus the headers below. Workers of every other
group of the topic pass over it as if they had acked it (no handler runs, no signal is
sent); the named group's workers deliver it like any other message, with ``Message.id``
set back to the id the original was published with.
"""

from __future__ import annotations

import json
from typing import Any

GROUP_HEADER = "sqlqueue-replay-group"  # the only consumer group that runs the replay
ORIGINAL_ID_HEADER = "sqlqueue-original-id"  # the id the original was published with
ORIGINAL_OFFSET_HEADER = "sqlqueue-original-offset"  # the original's offset in the log
DEAD_LETTER_HEADER = "sqlqueue-dead-letter-offset"  # the dead-letter copy it came from
# Header names a publisher may not use (publish(), publish_many() and the Spark writer
# refuse them, in any letter case): only a replay, built in the database, carries them.
RESERVED_PREFIX = "sqlqueue-"


def replay_target(metadata: Any) -> str | None:
    """The group a log row's headers reserve it for, or None for a normal message.

    Called for every message a worker reads: text is searched before it is decoded, so
    a normal message costs one substring test.
    """
    if isinstance(metadata, bytes | bytearray):
        metadata = metadata.decode("utf-8", "replace")
    if isinstance(metadata, str):
        if GROUP_HEADER not in metadata:
            return None
        metadata = json.loads(metadata)
    if isinstance(metadata, dict):
        target = metadata.get(GROUP_HEADER)
        return target if isinstance(target, str) and target else None
    return None
