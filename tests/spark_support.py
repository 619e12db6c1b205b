"""Helpers of the Spark tests: the shared session, and the test database as a URL."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection


def require_spark() -> Any:
    """pyspark, once pyarrow is there too. Without the spark extra the Spark tests are
    skipped, saying why; where the extra must be there (``make test-backends`` sets
    SQLQUEUE_REQUIRE_SPARK=1) its absence fails them instead."""
    reason = "the spark extra (pyspark, pyarrow) is not installed"
    if os.environ.get("SQLQUEUE_REQUIRE_SPARK") == "1":
        try:
            import pyarrow  # noqa: F401
            import pyspark
        except ImportError as exc:
            pytest.fail(f"{reason} but SQLQUEUE_REQUIRE_SPARK=1: {exc}")
        return pyspark
    pytest.importorskip("pyarrow", reason=reason)
    return pytest.importorskip("pyspark", reason=reason)


def start_session() -> Any:
    require_spark()
    from pyspark.sql import SparkSession

    from django_sqlqueue.spark import register

    # Executors' Python workers run this interpreter, where django_sqlqueue is installed.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Spark gives timestamps back as naive local times: make local time UTC.
    os.environ["TZ"] = "UTC"
    time.tzset()
    # local[2,2]: two threads, and a failed task is tried once more, as on a cluster.
    session = (
        SparkSession.builder.master("local[2,2]").appName("sqlqueue-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def database_url() -> str:
    """The test database pytest-django created, as the data source's ``url`` option."""
    settings = connection.settings_dict
    name = str(settings["NAME"])
    if connection.vendor == "sqlite":
        return f"sqlite:///{name}"
    scheme = "mysql" if connection.vendor == "mysql" else "postgres"
    user = quote(settings.get("USER") or "")
    password = settings.get("PASSWORD") or ""
    auth = f"{user}:{quote(password)}@" if password else f"{user}@"
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    return f"{scheme}://{auth}{settings.get('HOST') or '127.0.0.1'}{port}/{name}"


def kill_python_workers(spark: Any) -> int:
    """SIGKILL the Python workers this session's JVM forked (a task's process dies, as
    when an executor is lost); return how many."""
    jvm = spark.sparkContext._gateway.proc.pid
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    killed = 0
    for daemon in children.get(jvm, []):  # pyspark.daemon, which forks the workers
        for worker in children.get(daemon, []):
            try:
                os.kill(worker, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed
