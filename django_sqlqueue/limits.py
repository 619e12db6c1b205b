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
ERROR_LENGTH = 10_000  # characters of a handler's error kept (MySQL TEXT holds 64 KiB)
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024  # SQLQUEUE["MAX_PAYLOAD_BYTES"]'s default
