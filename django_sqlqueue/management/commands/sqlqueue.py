"""``manage.py sqlqueue <subcommand>``: operator tasks on the queue tables.

Each subcommand is a subparser built by ``add_<name>_arguments`` and run by
``handle_<name>``; add both to add one. Errors end the command with one readable line
and exit status 2, never a traceback or a usage screen.
"""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_sqlqueue.conf import MAX_PARTITIONS
from django_sqlqueue.exceptions import TopicNotDrained
from django_sqlqueue.groups import GroupInUse, UnknownGroup, forget_group
from django_sqlqueue.repartition import repartition

USAGE_ERROR = 2  # exit status for bad input and refused operations

SUBCOMMANDS = {
    "repartition": "Change a drained topic's partition count.",
    "forget": "Retire a consumer group: delete its state so it no longer holds back GC.",
}


def _errors_in_one_line(parser: ArgumentParser, prog: str) -> None:
    """Make argparse errors one line (and status 2) instead of a usage screen."""

    def error(message: str) -> NoReturn:
        if not getattr(parser, "called_from_command_line", False):
            raise CommandError(f"Error: {message}", returncode=USAGE_ERROR)
        sys.stderr.write(f"{prog}: error: {message} (see --help)\n")
        sys.exit(USAGE_ERROR)

    parser.error = error  # type: ignore[method-assign]


class Command(BaseCommand):
    help = "Operator tasks on the queue tables; see 'sqlqueue SUBCOMMAND --help'."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        _errors_in_one_line(parser, "sqlqueue")
        return parser

    def add_arguments(self, parser: ArgumentParser) -> None:
        subparsers = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
        for name, text in SUBCOMMANDS.items():
            subparser = subparsers.add_parser(name, help=text, description=text)
            getattr(self, f"add_{name}_arguments")(subparser)
            subparser.add_argument("--database", default="default",
                                   help="Database alias holding the queue tables (default: default).")
            _errors_in_one_line(subparser, f"sqlqueue {name}")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["database"] not in connections:
            raise CommandError(f"unknown database alias {options['database']!r}",
                               returncode=USAGE_ERROR)
        getattr(self, f"handle_{options['subcommand']}")(options)

    # ----------------------------------------------------------------- repartition

    def add_repartition_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--topic", required=True, help="The topic to repartition.")
        # A string, checked in handle_repartition(), so a bad value gets the same one-line
        # error from call_command() as from the command line.
        parser.add_argument("--partitions", required=True, metavar="N",
                            help=f"The new partition count, 1 to {MAX_PARTITIONS}.")

    def handle_repartition(self, options: dict[str, Any]) -> None:
        text = str(options["partitions"]).strip()
        partitions = int(text) if text.isdecimal() and text.isascii() else 0
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise CommandError(
                f"--partitions must be a whole number from 1 to {MAX_PARTITIONS}, got {text!r}",
                returncode=USAGE_ERROR,
            )
        try:
            result = repartition(options["topic"], partitions, using=options["database"])
        except (TopicNotDrained, ValueError) as exc:
            raise CommandError(str(exc), returncode=USAGE_ERROR) from exc
        topic = result.topic
        if result.old_partitions is None:
            line = f"topic {topic!r}: recorded {result.new_partitions} partitions"
        elif not result.changed:
            line = f"topic {topic!r} already has {result.new_partitions} partitions; nothing changed"
        else:
            line = (f"topic {topic!r}: {result.old_partitions} -> {result.new_partitions} "
                    f"partitions; deleted {result.deleted_messages} consumed messages")
        self.stdout.write(line)

    # ----------------------------------------------------------------- forget

    def add_forget_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--group", required=True, help="The consumer group to retire.")
        parser.add_argument("--topic", default=None,
                            help="Only this topic (default: every topic of the group).")

    def handle_forget(self, options: dict[str, Any]) -> None:
        group, topic = options["group"].strip(), options["topic"]
        if not group or (topic is not None and not topic.strip()):
            raise CommandError("--group and --topic must not be empty", returncode=USAGE_ERROR)
        try:
            done = forget_group(group, topic, using=options["database"])
        except (GroupInUse, UnknownGroup) as exc:
            raise CommandError(str(exc), returncode=USAGE_ERROR) from exc
        self.stdout.write(
            f"forgot consumer group {done.group!r} on {', '.join(map(repr, done.topics))}: "
            f"{done.watermarks} watermark(s), {done.deliveries} delivery row(s), "
            f"{done.leases} lease(s), {done.heartbeats} heartbeat(s) deleted"
        )
