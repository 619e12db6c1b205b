"""Column sizes shared by the tables, chosen to fit MySQL's 3,072-byte index limit in utf8mb4.

Plain constants with no Django import, so code that runs without Django settings (the
Spark data source on executors) shares them with the models.
"""

TOPIC_LENGTH = 255  # column size; published topics are limited to MAX_TOPIC_LENGTH
MAX_TOPIC_LENGTH = 200  # leaves room for the dead-letter suffix
KEY_LENGTH = 255
ID_LENGTH = 128
GROUP_LENGTH = 100
SUBSCRIBER_NAME_LENGTH = 255
# A fleet-wide limit's scope name: a subscription's is "group:topic" (100 + 1 + 255).
SCOPE_LENGTH = 360
ERROR_LENGTH = 10_000  # characters of a handler's error kept (MySQL TEXT holds 64 KiB)
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024  # SQLQUEUE["MAX_PAYLOAD_BYTES"]'s default
# Levels of arrays and objects a payload may nest (a scalar is 0, [1] is 1). MariaDB's
# JSON check refuses 32 and more, and Python decodes JSON recursively, as deep as the
# interpreter's stack allows (about 1,000 levels on 3.11, varying by version and by how
# deep the caller already is): one limit below both holds on every backend and version.
MAX_PAYLOAD_DEPTH = 31


def storable_error(text: str, limit: int | None = ERROR_LENGTH, *, keep_end: bool = False) -> str:
    """``text`` as every backend can store it in an error column: NUL characters (which
    PostgreSQL refuses) and lone surrogates (which no UTF-8 column takes, and which a file
    name decoded with ``surrogateescape`` brings along) written out as escapes, and cut
    to ``limit`` characters (None: not cut). ``keep_end`` keeps the end of a longer text
    as well as its start, with a note of what was dropped between (a traceback's last
    line names the exception)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is None or len(text) <= limit:
        return text
    if not keep_end:
        return text[:limit]
    head = limit // 4
    widest = len(f"\n[... {len(text):,} characters dropped ...]\n")
    tail = max(0, limit - head - widest)
    note = f"\n[... {len(text) - head - tail:,} characters dropped ...]\n"
    return text[:head] + note + text[len(text) - tail:]
