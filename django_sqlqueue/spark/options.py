"""The data source's options, read and checked on the driver.

Spark hands options over as a case-insensitive mapping of strings: every number and flag
is parsed here, once, and a wrong one is a :class:`SparkOptionError` naming the option,
raised on the driver before any task starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from ..encoding import validate_topic
from ..exceptions import InvalidMessage, SQLQueueError
from ..limits import DEFAULT_MAX_PAYLOAD_BYTES, GROUP_LENGTH
from ..store.connection import parse_url, redact
from ..store.url_secrets import hide

TABLES = ("messages", "dead_letters", "delivery", "offsets", "leases", "heartbeats")
STARTING_POSITIONS = ("earliest", "latest")
MAX_PARTITIONS_OPTION = 4096  # a topic's partition limit, as SQLQUEUE["PARTITIONS"]'s


class SparkOptionError(SQLQueueError, ValueError):
    """An option of the ``sqlqueue`` data source is missing or wrong."""


@dataclass(frozen=True, repr=False)
class Options:
    """The options of one read or write. ``url`` carries the database password: it is
    shown only through :func:`redact` (in ``repr()`` too), and :meth:`hide` blots it out
    of any text that might quote it."""

    url: str
    # A read replica of ``url``'s database, for batch reads only (streams and writes use
    # ``url``): the Spark side of SQLQUEUE["READ_DATABASE"]. None: batch reads use ``url``.
    read_url: str | None
    topics: tuple[str, ...]
    table: str
    num_partitions: int
    start_position: int | None
    end_position: int | None
    page_size: int
    # writing
    id_columns: tuple[str, ...]
    topic_column: str | None
    partitions: int | None
    batch_size: int
    max_payload_bytes: int
    # streaming
    group: str | None
    starting_position: str
    max_rows_per_batch: int | None
    fail_on_data_loss: bool

    def __repr__(self) -> str:
        values = ", ".join(
            f"{field.name}={self._shown(field.name)}" for field in fields(self))
        return f"Options({values})"

    def _shown(self, name: str) -> str:
        value = getattr(self, name)
        return repr(redact(value) if name in ("url", "read_url") and value else value)

    @property
    def batch_url(self) -> str:
        """The database a batch read queries: the read replica when given."""
        return self.read_url or self.url

    def hide(self, text: str) -> str:
        """``text`` with the url's password (if any) replaced by ``***``, in any spelling
        (the driver is given the decoded password: an error might quote either form)."""
        text = hide(text, self.url)
        return hide(text, self.read_url) if self.read_url else text


def _int(options: Mapping[str, str], name: str, default: int | None, *, least: int = 1,
         most: int | None = None) -> int | None:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise SparkOptionError(f"option {name} must be an integer, got {raw!r}") from None
    if value < least or (most is not None and value > most):
        bound = f"from {least} to {most}" if most is not None else f">= {least}"
        raise SparkOptionError(f"option {name} must be an integer {bound}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise SparkOptionError(f"option {name} must be true or false, got {raw!r}")


def _names(raw: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (raw or "").split(",") if part.strip())


def parse(options: Mapping[str, str]) -> Options:
    """Read and check every option; raise SparkOptionError on the first wrong one."""
    url = options.get("url")
    if not url:
        raise SparkOptionError(
            'option url is required: .option("url", "mysql://user:password@host:3306/db"), '
            "the DATABASE_URL of the Django project")
    try:
        parse_url(str(url))
    except SQLQueueError as exc:
        raise SparkOptionError(f"option url: {exc}") from None
    read_url = options.get("readUrl")
    if read_url is not None:
        try:
            parse_url(str(read_url))
        except SQLQueueError as exc:
            raise SparkOptionError(f"option readUrl: {exc}") from None
    topics = _names(options.get("topic"))
    for topic in topics:
        try:
            validate_topic(topic)
        except InvalidMessage as exc:
            raise SparkOptionError(f"option topic: {exc}") from None
    table = str(options.get("table") or "messages").strip().lower()
    if table not in TABLES:
        raise SparkOptionError(f"option table must be one of {', '.join(TABLES)}, got {table!r}")
    group = options.get("group")
    if group is not None:
        group = str(group).strip()
        try:
            validate_topic(group)  # the same rule as @subscriber's group names
        except InvalidMessage:
            raise SparkOptionError(
                f"option group {group!r} is not a group name (letters, digits, '.', '_', '-')"
            ) from None
        if len(group) > GROUP_LENGTH:
            raise SparkOptionError(f"option group is longer than {GROUP_LENGTH} characters")
    starting = str(options.get("startingPosition") or "earliest").strip().lower()
    if starting not in STARTING_POSITIONS:
        raise SparkOptionError(
            f"option startingPosition must be earliest or latest, got {starting!r}")
    start = _int(options, "startPosition", None, least=0)
    end = _int(options, "endPosition", None, least=0)
    if start is not None and end is not None and end < start:
        raise SparkOptionError(f"option endPosition ({end}) is below startPosition ({start})")
    topic_column = options.get("topicColumn")
    if topic_column is not None and topics:
        raise SparkOptionError("give either option topic or option topicColumn, not both")
    return Options(
        url=str(url),
        read_url=str(read_url) if read_url is not None else None,
        topics=topics,
        table=table,
        num_partitions=_int(options, "numPartitions", 4, most=10_000) or 4,
        start_position=start,
        end_position=end,
        page_size=_int(options, "pageSize", 10_000, most=1_000_000) or 10_000,
        id_columns=_names(options.get("idColumns")),
        topic_column=str(topic_column).strip() if topic_column is not None else None,
        partitions=_int(options, "partitions", None, most=MAX_PARTITIONS_OPTION),
        batch_size=_int(options, "batchSize", 1000, most=100_000) or 1000,
        max_payload_bytes=(_int(options, "maxPayloadBytes", DEFAULT_MAX_PAYLOAD_BYTES)
                           or DEFAULT_MAX_PAYLOAD_BYTES),
        group=group,
        starting_position=starting,
        max_rows_per_batch=_int(options, "maxRowsPerBatch", None),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
    )
