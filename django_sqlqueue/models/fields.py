"""Column sizes shared by the tables, chosen to fit MySQL's 3,072-byte index limit in utf8mb4."""

from ..limits import (  # noqa: F401 - re-exported for the models
    ERROR_LENGTH,
    GROUP_LENGTH,
    ID_LENGTH,
    KEY_LENGTH,
    MAX_TOPIC_LENGTH,
    SCOPE_LENGTH,
    SUBSCRIBER_NAME_LENGTH,
    TOPIC_LENGTH,
    storable_error,
)

