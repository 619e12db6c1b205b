"""Which partition of its topic a message belongs to.

A topic has a fixed number of partitions (``SQLQUEUE["PARTITIONS"]``, or
``SQLQUEUE["TOPICS"][topic]["PARTITIONS"]``), recorded in ``queue_topics`` the first time
the topic is sequenced. A partition is the unit of leasing, fair share and watermarks; a
key is the unit of ordering. Many keys share a partition, and a key's messages always land
in the same one, so they are handled in order by one worker at a time.

The mapping is the same in every process and language::

    partition = crc32(key.encode("utf-8")) % partitions      # a message with a key
    partition = offset % partitions                          # a keyless message

CRC-32 is the IEEE polynomial of zlib, Java's ``java.util.zip.CRC32``, MySQL's ``CRC32()``
and Spark SQL's ``crc32()``. Keyless messages carry no order, so they are spread round
robin by their log offset and every worker of a group gets a share of them.
"""

from __future__ import annotations

import zlib


def partition_for(key: str, partitions: int) -> int:
    """The partition (0 ≤ p < ``partitions``) that messages with ``key`` go to."""
    if not isinstance(key, str) or not key:
        raise ValueError("partition_for() needs a non-empty key; keyless messages are spread "
                         "by offset (offset % partitions)")
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")
    return _key_partition(key, partitions)


def assign_partition(key: str, offset: int, partitions: int) -> str:
    """The ``partition_key`` column value of a message: its partition number as text."""
    return str(_key_partition(key, partitions) if key else offset % partitions)


def _key_partition(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


def partition_names(partitions: int) -> list[str]:
    """The ``partition_key`` values of a topic with ``partitions`` partitions."""
    return [str(number) for number in range(partitions)]
