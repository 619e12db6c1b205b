"""Column sizes shared by the tables, chosen to fit MySQL's 3,072-byte index limit in utf8mb4."""

from ..limits import (  # noqa: F401 - re-exported for the models
    ERROR_LENGTH,
    GROUP_LENGTH,
    ID_LENGTH,
    KEY_LENGTH,
    MAX_TOPIC_LENGTH,
    SUBSCRIBER_NAME_LENGTH,
    TOPIC_LENGTH,
)


def storable_error(text: str) -> str:
    """``text`` as every backend can store it in an error column: NUL characters (which
    PostgreSQL refuses) and lone surrogates (which no UTF-8 column takes, and which a file
    name decoded with ``surrogateescape`` brings along) written out as escapes, and cut
    to ERROR_LENGTH characters."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text[:ERROR_LENGTH]
