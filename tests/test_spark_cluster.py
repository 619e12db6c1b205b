"""The data source on a real standalone Spark cluster: a master and a worker on 127.0.0.1,
started with the spark-class script pyspark ships, so executors are JVMs and Python
workers of their own that unpickle the readers and writers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from django_sqlqueue.models import QueueMessage
from tests.spark_support import database_url, require_spark

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@pytest.fixture
def cluster(tmp_path):
    if connection.vendor != "mysql":
        pytest.skip("the standalone-cluster run is made on MariaDB only (it takes a minute)")
    pyspark = require_spark()
    home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(tmp_path / "work")}
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    spark_class = str(home / "bin" / "spark-class")
    processes = []
    try:
        with open(tmp_path / "master.log", "wb") as log:
            processes.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(free_port())],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        wait_for_port(port)
        with open(tmp_path / "worker.log", "wb") as log:
            processes.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", master_url,
                 "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                 "--webui-port", str(free_port())],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        yield master_url, env
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()


def test_a_bulk_publish_and_a_read_run_on_a_standalone_cluster(cluster):
    master_url, env = cluster
    job = subprocess.run(
        [sys.executable, "-m", "tests.spark_cluster_job", master_url, database_url()],
        env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert job.returncode == 0, job.stderr[-3000:]
    result = json.loads(job.stdout.strip().splitlines()[-1])
    assert result["ids"] == list(range(100))
    # The tasks ran in the cluster worker's executor JVM, not in the driver's.
    assert result["task_jvms"] and result["driver_jvm"] not in result["task_jvms"]
    assert QueueMessage.objects.filter(topic="cluster").count() == 100
