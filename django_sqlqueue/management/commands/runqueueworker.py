"""``manage.py runqueueworker``: consume the subscriptions declared in apps' queues.py, and
run the task queues of ``TASKS`` backends that are ``django_sqlqueue.tasks.QueueBackend``."""

from __future__ import annotations

import gc
import logging
import os
import sys
from argparse import ArgumentParser
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_sqlqueue.conf import get_settings, queue_database
from django_sqlqueue.management.connecting import wait_for
from django_sqlqueue.management.worker_selection import USAGE_ERROR, _select
from django_sqlqueue.metrics import MISSING as METRICS_MISSING
from django_sqlqueue.metrics import available as metrics_available
from django_sqlqueue.metrics.worker import WorkerMetrics
from django_sqlqueue.models.fields import SUBSCRIBER_NAME_LENGTH
from django_sqlqueue.worker.engines import build_engines, run_engines
from django_sqlqueue.worker.process import EXIT_HANDLERS_ABANDONED, default_worker_name

# Handler threads per worker. Each may hold a database connection of its own, and this is
# already far over the servers' default connection limits (MariaDB 151, PostgreSQL 100);
# a larger number is a typo. Run more workers instead.
MAX_CONCURRENCY = 1000
# Where the worker's metrics server listens unless --metrics-address says otherwise: this
# machine only, so the worker's group and topic names are not served to the network.
METRICS_ADDRESS = "127.0.0.1"


class Command(BaseCommand):
    help = ("Run a queue worker for the @subscriber handlers in your apps' queues.py modules "
            "and the task queues of django_sqlqueue's Tasks backend.")

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """Bad arguments end the command with one readable line, not a usage screen."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)

        def error(message: str) -> NoReturn:
            if not parser.called_from_command_line:
                raise CommandError(f"Error: {message}", returncode=USAGE_ERROR)
            sys.stderr.write(f"runqueueworker: error: {message} (see --help)\n")
            sys.exit(USAGE_ERROR)

        parser.error = error  # type: ignore[method-assign]
        return parser

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--group", action="append", default=[], metavar="GROUP",
                            help="Only run this consumer group (repeatable).")
        parser.add_argument("--topic", action="append", default=[], metavar="TOPIC",
                            help="Only run subscriptions to this topic (repeatable).")
        parser.add_argument("--queue", action="append", default=[], metavar="QUEUE",
                            help="Run this task queue of a django_sqlqueue Tasks backend "
                                 "(repeatable). With no --queue, --group or --topic, a worker "
                                 "runs every subscription and every task queue.")
        parser.add_argument("--name", default=None,
                            help="Subscriber name, unique per worker (default: host:pid).")
        # A string, checked in handle(), so a bad value gets the same one-line error from
        # call_command() as from the command line.
        parser.add_argument("--concurrency", default="4", metavar="N",
                            help=f"Handler threads, 1 to {MAX_CONCURRENCY} (default: 4).")
        parser.add_argument("--burst", action="store_true",
                            help="Exit once no subscribed partition has a deliverable message.")
        parser.add_argument("--no-schedules", action="store_true",
                            help="Do not fire recurring schedules here (by default every "
                                 "worker may fire them; each tick still fires once).")
        parser.add_argument("--database", default=None,
                            help="Database alias holding the queue tables of every selected "
                                 "topic (default: each topic's own: SQLQUEUE['TOPICS'][topic]"
                                 "['DATABASE'], else SQLQUEUE['DATABASE'], or where "
                                 "DATABASE_ROUTERS send the app: normally 'default').")
        parser.add_argument("--metrics-port", default=None, metavar="PORT",
                            help="Serve Prometheus metrics of this worker on PORT (needs the "
                                 "'metrics' extra).")
        parser.add_argument("--metrics-address", default=None, metavar="ADDRESS",
                            help="Address the metrics server binds to, with --metrics-port "
                                 f"(default: {METRICS_ADDRESS}, this machine only; 0.0.0.0 "
                                 "or :: listens on every interface).")

    def execute(self, *args: Any, **options: Any) -> Any:
        # The system checks query the database: a worker started while the database
        # restarts or fails over (a supervisor restarting everything at once) waits for it
        # first, as long as it takes, as it waits out any later fault.
        _configure_logging(int(options.get("verbosity", 1)))
        wait_for(options.get("database") or queue_database(), timeout=None)
        return super().execute(*args, **options)

    def get_check_kwargs(self, options: dict[str, Any]) -> Any:
        # Django 6 checks the fields against every alias of DATABASES, connecting to each:
        # a worker started while a server holding other topics is down would not start.
        # The queue alias waited for above is checked; the others are met by their engines.
        kwargs = dict(super().get_check_kwargs(options))
        kwargs["databases"] = [options.get("database") or queue_database()]
        return kwargs

    def handle(self, *args: Any, **options: Any) -> None:
        explicit = options["database"]
        options["database"] = explicit or queue_database()
        concurrency = _check_options(options)
        name = options["name"] or default_worker_name()
        selected = _select(options, name)
        _configure_logging(int(options["verbosity"]))
        metrics = _start_metrics(options["metrics_port"], options["metrics_address"])
        # One engine per alias the selected topics live on (SQLQUEUE["TOPICS"] may place
        # them apart); --database puts every one on that alias instead.
        workers = build_engines(selected, name=name, concurrency=concurrency,
                                database=explicit, schedules=not options["no_schedules"],
                                burst=options["burst"], metrics=metrics)
        if metrics is not None:
            metrics.watch_leases(
                lambda: [p for worker in workers for p in worker.partitions.values()])
        # What start-up built (Django, the handlers' modules) lives as long as the process:
        # kept out of the collector's full passes, which otherwise walk all of it again
        # and again while the poll cycle's short-lived objects trigger them.
        gc.freeze()
        try:
            worker = run_engines(workers, get_settings().shutdown_grace)
        finally:
            if metrics is not None:
                metrics.stop()
        code = worker.exit_code
        if code == EXIT_HANDLERS_ABANDONED:
            # The hung handlers' threads would keep the interpreter alive at exit: end the
            # process now, as the operator who sent SIGTERM expects.
            sys.stderr.write(f"CommandError: {worker.exit_reason}\n")
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code:
            raise CommandError(worker.exit_reason or f"worker exited with status {code}",
                               returncode=code)


def _check_options(options: dict[str, Any]) -> int:
    """Refuse a bad --database, --name or --concurrency in one line; return the concurrency."""
    if options["database"] not in connections:
        raise CommandError(f"unknown database alias {options['database']!r}",
                           returncode=USAGE_ERROR)
    name = options["name"]
    if name is not None and not name.strip():
        raise CommandError("--name must not be empty", returncode=USAGE_ERROR)
    if name is not None and len(name) > SUBSCRIBER_NAME_LENGTH:
        raise CommandError(f"--name is {len(name)} characters long; the limit is "
                           f"{SUBSCRIBER_NAME_LENGTH}", returncode=USAGE_ERROR)
    if name is not None and not name.isprintable():
        # A control character would split the worker's log lines, and a lone surrogate (an
        # undecodable byte) or NUL cannot be stored: the worker would retry its first
        # statement for ever.
        raise CommandError(f"--name must be printable text, without control characters or "
                           f"undecodable bytes, got {name!r}", returncode=USAGE_ERROR)
    text = str(options["concurrency"]).strip()
    concurrency = int(text) if text.isdecimal() and text.isascii() else 0
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise CommandError(f"--concurrency must be a whole number from 1 to {MAX_CONCURRENCY}, "
                           f"got {text!r}", returncode=USAGE_ERROR)
    return concurrency


def _start_metrics(port_option: Any, address_option: Any = None) -> WorkerMetrics | None:
    """Serve the worker's metrics on --metrics-port (bound to --metrics-address), or
    return None (no cost) without it."""
    if port_option is None:
        if address_option is not None:
            raise CommandError("--metrics-address needs --metrics-port", returncode=USAGE_ERROR)
        return None
    address = METRICS_ADDRESS if address_option is None else str(address_option).strip()
    if not address or not address.isprintable():
        raise CommandError(f"--metrics-address must be an IP address or a host name, got "
                           f"{address_option!r}", returncode=USAGE_ERROR)
    text = str(port_option).strip()
    port = int(text) if text.isascii() and text.isdecimal() else 0
    if not 1 <= port <= 65535:
        raise CommandError(f"--metrics-port must be a port number from 1 to 65535, got {text!r}",
                           returncode=USAGE_ERROR)
    if not metrics_available():
        raise CommandError(f"--metrics-port: {METRICS_MISSING}", returncode=USAGE_ERROR)
    metrics = WorkerMetrics()
    try:
        metrics.serve(port, address)
    except (OSError, UnicodeError) as exc:  # UnicodeError: a host name IDNA cannot encode
        reason = getattr(exc, "strerror", None) or exc
        raise CommandError(f"cannot serve metrics on {address} port {port}: {reason}",
                           returncode=USAGE_ERROR) from exc
    metrics.connect()
    return metrics


def _configure_logging(verbosity: int) -> None:
    """Show the worker's log lines on stderr unless the project configured that logger."""
    logger = logging.getLogger("django_sqlqueue")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbosity > 1 else logging.INFO if verbosity else logging.WARNING)
