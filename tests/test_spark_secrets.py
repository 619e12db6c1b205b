"""The password of the url option never leaves: not in a repr, a plan, an error or a log line."""

from __future__ import annotations

import logging

import pytest

from tests.spark_support import require_spark

pytestmark = [pytest.mark.spark]

SECRET = "s3cretpw"
# Nothing listens on port 1: every connection attempt fails at once.
UNREACHABLE = f"mysql://u:{SECRET}@127.0.0.1:1/db"
CANNOT_CONNECT = r"cannot connect to mysql://u:\*\*\*@127\.0\.0\.1:1/db"


@pytest.fixture
def logs(caplog):
    """Every log line of the package, DEBUG included."""
    caplog.set_level(logging.DEBUG, logger="django_sqlqueue")
    return caplog


def test_the_options_and_the_write_plan_hide_the_password():
    require_spark()
    from pyspark.sql.types import StringType, StructField, StructType

    from django_sqlqueue.spark.options import parse
    from django_sqlqueue.spark.writing import WritePlan, plan_write

    options = parse({"url": UNREACHABLE, "topic": "orders"})
    plan = WritePlan(options, True, False, ("payload", "id"))
    for text in (repr(options), str(options), repr(plan), str(plan)):
        assert SECRET not in text
        assert "mysql://u:***@127.0.0.1:1/db" in text
    assert options.url == UNREACHABLE  # the connection still gets it
    schema = StructType([StructField("payload", StringType()), StructField("id", StringType())])
    with pytest.raises(Exception, match=CANNOT_CONNECT) as failure:
        plan_write(options, schema)  # looks the topic up
    assert SECRET not in str(failure.value) and SECRET not in repr(failure.value)


def test_hide_blots_out_the_password_in_either_spelling():
    from django_sqlqueue.spark.options import parse

    options = parse({"url": "postgres://u:p%40ss@127.0.0.1:5432/db", "topic": "orders"})
    assert options.hide("auth failed for p@ss (p%40ss)") == "auth failed for *** (***)"
    assert options.hide("nothing secret") == "nothing secret"


def test_a_batch_read_shows_no_password_in_its_plans_or_errors(spark, logs, capsys):
    df = spark.read.format("sqlqueue").option("url", UNREACHABLE).option("topic", "orders").load()
    texts = [df._jdf.queryExecution().toString(), df._jdf.queryExecution().analyzed().toString()]
    df.explain(True)
    explained = capsys.readouterr().out
    with pytest.raises(Exception, match=CANNOT_CONNECT) as failure:
        df.collect()
    texts += [explained, str(failure.value), repr(failure.value)]
    texts += [record.getMessage() for record in logs.records]

    assert "== Physical Plan ==" in explained
    for text in texts:
        assert SECRET not in text


def test_a_stream_shows_no_password_in_its_plans_progress_or_errors(spark, tmp_path, logs, capsys):
    stream = (spark.readStream.format("sqlqueue").option("url", UNREACHABLE)
              .option("topic", "orders").option("group", "analytics").load())
    texts = [stream._jdf.queryExecution().toString()]
    stream.explain(True)
    query = (stream.writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    with pytest.raises(Exception, match=CANNOT_CONNECT) as failure:
        query.awaitTermination(60)
    texts += [str(failure.value), repr(failure.value), str(query.exception()),
              str(query.recentProgress), str(query.status), capsys.readouterr().out]
    texts += [record.getMessage() for record in logs.records]

    for text in texts:
        assert SECRET not in text


def test_a_write_shows_no_password_in_its_error(spark, logs):
    df = spark.createDataFrame([('{"n": 1}', "one")], "payload string, id string")
    with pytest.raises(Exception, match=CANNOT_CONNECT) as failure:
        (df.write.format("sqlqueue").option("url", UNREACHABLE).option("topic", "orders")
         .mode("append").save())
    texts = [str(failure.value), repr(failure.value)]
    texts += [record.getMessage() for record in logs.records]

    for text in texts:
        assert SECRET not in text


@pytest.mark.django_db(transaction=True)
def test_a_working_stream_and_write_show_no_password_in_plans_or_progress(spark, tmp_path, logs,
                                                                         capsys):
    from django.db import connection

    from django_sqlqueue import publish
    from django_sqlqueue.sequencing import partition_counts
    from tests.spark_support import database_url

    if connection.vendor != "postgresql":
        pytest.skip("needs a database that accepts a URL with a password: the test PostgreSQL "
                    "server trusts local connections whatever the password")
    password = connection.settings_dict.get("PASSWORD") or SECRET
    url = database_url()
    if not connection.settings_dict.get("PASSWORD"):
        url = url.replace("@", f":{SECRET}@", 1)
    partition_counts(["orders"], "default")
    for i in range(3):
        publish("orders", {"n": i}, key=f"k{i}", id=f"s{i}")

    batch = spark.read.format("sqlqueue").option("url", url).option("topic", "orders").load()
    assert batch.count() == 3
    batch.explain(True)
    query = (spark.readStream.format("sqlqueue").option("url", url).option("topic", "orders")
             .option("group", "analytics").load()
             .selectExpr("payload", "key", "concat('copy-', id) AS id")
             .writeStream.format("sqlqueue").option("url", url).option("topic", "copies")
             .option("partitions", "4").option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    query.explain(True)
    texts = [batch._jdf.queryExecution().toString(), str(query.recentProgress),
             str(query.lastProgress), str(query.status), capsys.readouterr().out]
    texts += [record.getMessage() for record in logs.records]

    assert query.lastProgress["sources"][0]["numInputRows"] == 3
    for text in texts:
        assert password not in text
