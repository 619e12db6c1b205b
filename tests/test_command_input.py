"""Every option of the management commands given a bad value: one line, exit status 2.

``call_command`` raises the CommandError that the command line prints as its one line;
a few cases run the real command line too, with arguments that are not even valid UTF-8.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_sqlqueue.models import ConsumerOffset
from tests.worker_harness import REPO_ROOT, run_command, run_manage, worker_env

pytestmark = pytest.mark.django_db


def refused(*args: str) -> CommandError:
    """Run ``manage.py <args>`` in process; it must refuse with status 2 and one line."""
    with pytest.raises(CommandError) as caught:
        call_command(*args, stdout=io.StringIO(), stderr=io.StringIO())
    error = caught.value
    assert error.returncode == 2, (error.returncode, str(error))
    assert "\n" not in str(error), str(error)
    return error


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The only line a refused command printed; fails on a traceback or a usage screen."""
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def run_bytes(*args: bytes, command: str = "sqlqueue") -> subprocess.CompletedProcess[str]:
    """``manage.py <command> <args>`` with raw bytes on the command line, as a shell passes
    a badly encoded name; Python decodes them with lone surrogates."""
    return subprocess.run(
        [os.fsencode(sys.executable), b"-m", b"django", command.encode(), *args],
        cwd=REPO_ROOT, env=worker_env(), capture_output=True, text=True, errors="replace",
        timeout=60, check=False,
    )


# --------------------------------------------------------------------------- sqlqueue repartition


@pytest.mark.parametrize("partitions", [
    "0", "-1", "4097", "99999999999999999999", "1e3", "12.0", "0x10", "", " ", "twelve",
    "\u0661\u0662",  # Arabic-Indic digits: int() reads them as 12, the option does not
])
def test_repartition_refuses_a_partition_count_that_is_not_1_to_4096(partitions):
    error = refused("sqlqueue", "repartition", "--topic", "orders", "--partitions", partitions)

    assert "--partitions must be a whole number from 1 to 4096" in str(error)


@pytest.mark.parametrize("topic", ["", "has space", "x" * 201, "orders\n", "t\udcff", "ordres/1"])
def test_repartition_refuses_a_topic_that_is_not_a_topic_name(topic):
    error = refused("sqlqueue", "repartition", "--topic", topic, "--partitions", "4")

    assert "topic" in str(error)


def test_an_unknown_database_alias_is_refused():
    error = refused("sqlqueue", "forget", "--group", "billing", "--database", "nope")

    assert str(error) == "unknown database alias 'nope'"


def test_a_missing_subcommand_is_refused():
    error = refused("sqlqueue")

    assert "SUBCOMMAND" in str(error)


# --------------------------------------------------------------------------- sqlqueue forget


@pytest.mark.parametrize(("group", "topic"), [
    ("g\udcff", None), ("bill\ning", None), ("g" * 101, None), ("has space", None),
    ("billing", "t\udcff"), ("billing", "x" * 256), ("billing", "orders\n"),
])
def test_forget_refuses_a_name_no_group_or_topic_can_have(group, topic):
    ConsumerOffset.objects.create(consumer_group="billing", topic="orders", partition_key="0")
    args = ["--group", group] + (["--topic", topic] if topic is not None else [])

    error = refused("sqlqueue", "forget", *args)

    assert "is not a consumer group name" in str(error) or "is not a topic name" in str(error)
    assert ConsumerOffset.objects.filter(consumer_group="billing").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("args", [
    [b"forget", b"--group", b"g\xff"],
    [b"forget", b"--group", b"billing", b"--topic", b"\xff\xfe"],
    [b"repartition", b"--topic", b"\xffrders", b"--partitions", b"4"],
], ids=["group", "topic", "repartition-topic"])
def test_a_badly_encoded_name_on_the_command_line_is_one_line_not_a_traceback(args):
    line = one_error_line(run_bytes(*args))

    assert line.startswith("CommandError: ")
    assert "\\udcff" in line or "\\udcfe" in line  # the bad byte, shown as an escape


@pytest.mark.django_db(transaction=True)
def test_a_bad_partition_count_on_the_command_line_is_one_line():
    line = one_error_line(run_manage("sqlqueue", "repartition", "--topic", "orders",
                                     "--partitions", "1e3"))

    assert line == "CommandError: --partitions must be a whole number from 1 to 4096, got '1e3'"


# --------------------------------------------------------------------------- runqueueworker


@pytest.mark.parametrize("concurrency", [
    "0", "-1", "1001", "99999999999999999999", "1e3", "2.5", "", " ", "four", "\u0664",
])
def test_runqueueworker_refuses_a_concurrency_that_is_not_1_to_1000(concurrency):
    error = refused("runqueueworker", "--concurrency", concurrency)

    assert "--concurrency must be a whole number from 1 to 1000" in str(error)


@pytest.mark.parametrize(("name", "needle"), [
    ("", "must not be empty"), ("   ", "must not be empty"),
    ("w" * 256, "256 characters long; the limit is 255"),
    ("worker\n2", "printable"), ("w\x00", "printable"), ("w\udcff", "printable"),
    ("tab\there", "printable"),
])
def test_runqueueworker_refuses_a_name_it_could_not_store_or_log_on_one_line(name, needle):
    error = refused("runqueueworker", "--name", name)

    assert "--name" in str(error) and needle in str(error)


@pytest.mark.parametrize(("args", "needle"), [
    (["--group", "bill\ning"], "unknown group(s): 'bill\\ning'"),
    (["--topic", "t\udcff"], "unknown topic(s): 't\\udcff'"),
    (["--group", "billing", "--topic", "poison_dlq"], "no subscription matches both"),
    (["--database", "nope"], "unknown database alias 'nope'"),
    (["--concurrency"], "expected one argument"),
    (["--burst", "yes"], "unrecognized arguments: yes"),
])
def test_runqueueworker_refuses_other_bad_options_in_one_line(args, needle):
    error = refused("runqueueworker", *args)

    assert needle in str(error)


def test_the_largest_concurrency_and_a_unicode_name_pass_the_checks():
    # Both are accepted: the command gets as far as its subscriptions, and an unknown
    # group is what stops it here.
    error = refused("runqueueworker", "--concurrency", "1000", "--name", "wörker-1 ☃",
                    "--group", "nosuchgroup")

    assert "unknown group(s): 'nosuchgroup'" in str(error)


@pytest.mark.django_db(transaction=True)
def test_an_undecodable_worker_name_on_the_command_line_is_one_line_not_a_retry_loop():
    line = one_error_line(run_bytes(b"--name", b"w\xff", command="runqueueworker"))

    assert line == "CommandError: --name must be printable text, without control characters " \
                   "or undecodable bytes, got 'w\\udcff'"


# --------------------------------------------------------------------------- settings


@pytest.mark.django_db(transaction=True)
def test_bad_settings_stop_the_worker_before_it_starts_naming_every_check():
    result = run_command(settings={"POLL_INTERVAL": float("nan"),
                                   "VISIBILITY_TIMEOUT": float("inf"),
                                   "LEASE_DURATION": 10**12, "MAX_ATTEMPTS": "5"}, timeout=60)

    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    for check_id in ("sqlqueue.E002", "sqlqueue.E004", "sqlqueue.E005", "sqlqueue.E006"):
        assert check_id in result.stderr, result.stderr
