"""``manage.py sqlqueue <subcommand>``: operator tasks on the queue tables.

Each subcommand is a subparser built by ``add_<name>_arguments`` and run by
``handle_<name>``; add both to add one. Errors end the command with one readable line
and exit status 2, never a traceback or a usage screen.
"""

from __future__ import annotations

import json
import sys
from argparse import ArgumentParser
from dataclasses import replace
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper
from django.db import DatabaseError, connections

from django_sqlqueue import operations as ops
from django_sqlqueue.cancelling import cancel
from django_sqlqueue.conf import MAX_PARTITIONS
from django_sqlqueue.consuming.registry import autodiscover, subscriptions
from django_sqlqueue.db.schema_state import (
    NotMigrated,
    check_migrated,
    is_missing_schema,
    not_migrated_line,
)
from django_sqlqueue.exceptions import ConfigurationError, TopicNotDrained
from django_sqlqueue.groups import GroupInUse, UnknownGroup
from django_sqlqueue.management import aliases, connecting, tables
from django_sqlqueue.management.progress import ProgressBar
from django_sqlqueue.management.selection import (
    MAX_INDENT,
    batch_size_option,
    dead_letter_arguments,
    dead_letter_filter,
    json_indent,
    positive_seconds,
    refuse_dead_letter_topic,
)
from django_sqlqueue.models import ConsumerOffset, QueueMessage, Topic
from django_sqlqueue.repartition import repartition

USAGE_ERROR = 2  # exit status for bad input and refused operations

SUBCOMMANDS = {
    "stats": "One row per topic and consumer group: lag, in flight, dead letters, workers.",
    "limits": "One row per fleet-wide limit: slots running against max_running, tokens left, "
              "keys running.",
    "health": "Exit 0 when every (or the named) group has a live worker and nothing pending "
              "too long, else 1; one line either way.",
    "replay": "Re-deliver dead letters to the group that failed them, and only to it.",
    "discard": "Delete dead letters for good.",
    "pause": "Stop a consumer group's workers taking new deliveries of a topic.",
    "resume": "Let a paused consumer group go on where it stopped.",
    "deliver-now": "Make a message waiting out a delay or a retry backoff due at once.",
    "cancel": "Cancel a message that has not started, for one consumer group or for all; "
              "exit 1 when some group has started or handled it already.",
    "release-leases": "Free the partitions a worker holds; the group rebalances.",
    "gc": "Run garbage collection now and print what it deleted.",
    "repartition": "Change a drained topic's partition count.",
    "forget": "Retire a consumer group: delete its state so it no longer holds back GC.",
    "schedules": "List recurring schedules, pause or resume one, or run one now.",
}
SCHEDULE_ACTIONS = ("list", "pause", "resume", "run-now")
UNHEALTHY = 1  # exit status of a failed health check
NOT_CANCELLED = 1  # exit status of a cancel that found the message started for some group
NOT_MIGRATED = 1  # exit status when the queue tables are missing or behind the migrations


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
            getattr(self, f"add_{name.replace('-', '_')}_arguments")(subparser)
            aliases.add_database_argument(subparser, name)
            connecting.add_wait_argument(subparser)
            _errors_in_one_line(subparser, f"sqlqueue {name}")

    def execute(self, *args: Any, **options: Any) -> Any:
        # Before the system checks, which may query the database (MySQL's JSON support): a
        # command started while its database restarts or fails over waits for it.
        # Quiet while it waits (a probe reads one line), each retry shown with -v 2.
        wait, err = options.get("wait"), OutputWrapper(options.get("stderr") or sys.stderr)
        connecting.wait_for(
            aliases.command_database(options),
            connecting.CONNECT_WAIT if wait is None else positive_seconds("--wait", wait),
            err.write if int(options.get("verbosity", 1)) > 1 else connecting.quietly)
        return super().execute(*args, **options)

    def get_check_kwargs(self, options: dict[str, Any]) -> Any:
        # Django 6 checks the fields against every alias of DATABASES, connecting to each:
        # one server down (holding other topics) must not stop a command about the rest.
        kwargs = dict(super().get_check_kwargs(options))
        kwargs["databases"] = [aliases.command_database(options)]
        return kwargs

    def handle(self, *args: Any, **options: Any) -> None:
        targets = aliases.command_databases(options)
        for _, alias in targets:
            if alias not in connections:
                raise CommandError(f"unknown database alias {alias!r}", returncode=USAGE_ERROR)
        if len(targets) == 1:
            options["database"] = targets[0][1]
            self._handle_on(options)
            return
        # Topics on several aliases (SQLQUEUE["TOPICS"]): stats and health merge them, each
        # row labelled; the others run once per alias under its name.
        merged = getattr(self, f"handle_{options['subcommand'].replace('-', '_')}_on_many",
                         None)
        if merged is not None:
            merged(options, targets)
            return
        failures: list[CommandError] = []
        for label, alias in targets:
            self.stdout.write(f"database {label}:")
            try:
                self._handle_on({**options, "database": alias})
            except CommandError as exc:
                self.stderr.write(f"database {label}: {exc}")
                failures.append(exc)
        if len(failures) == len(targets) or any(f.returncode != USAGE_ERROR for f in failures):
            # Every alias refused (an unknown name everywhere), or one failed outright.
            raise failures[0]

    def _handle_on(self, options: dict[str, Any]) -> None:
        """Run the subcommand in ``options`` on its one alias, ``options["database"]``."""
        using = options["database"]
        try:
            check_migrated(using)
            getattr(self, f"handle_{options['subcommand'].replace('-', '_')}")(options)
        except (ops.OperationError, GroupInUse, UnknownGroup) as exc:
            raise CommandError(str(exc), returncode=USAGE_ERROR) from exc
        except NotMigrated as exc:
            raise CommandError(exc.line, returncode=NOT_MIGRATED) from exc
        except DatabaseError as exc:
            if is_missing_schema(exc):
                raise CommandError(not_migrated_line(using), returncode=NOT_MIGRATED) from exc
            gone = connecting.lost(using, exc)  # lost mid-command (a failover): one line
            if gone is None:
                raise
            raise gone from exc

    # ----------------------------------------------------------------- stats

    def add_stats_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true",
                            help="Print a JSON list of objects, one object per line, instead "
                                 "of a table.")
        parser.add_argument("--indent", default=None, metavar="N",
                            help=f"With --json: indent by N spaces (0 to {MAX_INDENT}), for "
                                 "reading.")
        parser.add_argument("--topic", default=None, help="Only this topic.")
        parser.add_argument("--group", default=None, help="Only this consumer group.")

    def handle_stats(self, options: dict[str, Any]) -> None:
        indent = json_indent(options["indent"], options["json"])
        self._known_names(options, options["database"])
        rows = ops.overview(topic=options["topic"], group=options["group"],
                            using=options["database"])
        if options["json"]:
            objects = [r.as_json() for r in rows]
            if indent is not None:
                self.stdout.write(json.dumps(objects, indent=indent))
            else:
                tables.write_json_lines(self.stdout.write, objects)
            return
        tables.write_overview(self.stdout.write, rows)
        unclaimed = ([] if options["group"] is not None else
                     ops.unclaimed_topics(topic=options["topic"], using=options["database"]))
        if not rows and not unclaimed:
            self.stdout.write("no consumer group is registered")
        for topic in unclaimed:
            self.stdout.write(topic.line)

    def handle_stats_on_many(self, options: dict[str, Any],
                             targets: list[tuple[str, str]]) -> None:
        indent = json_indent(options["indent"], options["json"])
        rows: list[ops.SubscriptionStats] = []
        unclaimed: list[str] = []
        for label, alias in targets:
            self._handle_on({**options, "database": alias, "subcommand": "stats_rows"})
            rows += [replace(row, database=label) for row in self._rows]
            unclaimed += [f"database {label}: {topic.line}" for topic in self._unclaimed]
        if options["json"]:
            objects = [r.as_json() for r in rows]
            if indent is not None:
                self.stdout.write(json.dumps(objects, indent=indent))
            else:
                tables.write_json_lines(self.stdout.write, objects)
            return
        tables.write_overview(self.stdout.write, rows, databases=True)
        if not rows and not unclaimed:
            self.stdout.write("no consumer group is registered")
        for line in unclaimed:
            self.stdout.write(line)

    def handle_stats_rows(self, options: dict[str, Any]) -> None:
        """One alias's part of stats over several (kept on self for the caller)."""
        self._known_names({"group": None, "topic": options["topic"]}, options["database"])
        self._rows = ops.overview(topic=options["topic"], group=options["group"],
                                  using=options["database"])
        self._unclaimed = ([] if options["group"] is not None else
                           ops.unclaimed_topics(topic=options["topic"],
                                                using=options["database"]))

    # ----------------------------------------------------------------- limits

    def add_limits_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true",
                            help="Print a JSON list of objects, one object per line, instead "
                                 "of a table.")

    def handle_limits(self, options: dict[str, Any]) -> None:
        rows = ops.limits_overview(using=options["database"])
        if options["json"]:
            tables.write_json_lines(self.stdout.write, [r.as_json() for r in rows])
        elif rows:
            tables.write_limits(self.stdout.write, rows)
        else:
            self.stdout.write("no limit has been used yet")

    # ----------------------------------------------------------------- health

    def add_health_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--group", default=None, help="Only this consumer group.")
        parser.add_argument("--max-age", default=None, metavar="S",
                            help="Fail when a message has been pending longer (seconds).")
        parser.add_argument("--strict", action="store_true",
                            help="Also fail when a topic has messages and no consumer group, "
                                 "or a @subscriber's topic has never had a message (a typo).")

    def handle_health(self, options: dict[str, Any]) -> None:
        healthy, line = self._health(options)
        if not healthy:
            raise CommandError(line, returncode=UNHEALTHY)
        self.stdout.write(line)

    def handle_health_on_many(self, options: dict[str, Any],
                              targets: list[tuple[str, str]]) -> None:
        """Healthy when every alias is; one line naming each alias's verdict."""
        parts, healthy = [], True
        for label, alias in targets:
            try:
                self._handle_on({**options, "database": alias, "subcommand": "health_part"})
            except CommandError as exc:
                if options["group"] is not None and "is not registered" in str(exc):
                    continue  # the group consumes topics on other aliases only
                self._verdict = (False, str(exc))
            healthy = healthy and self._verdict[0]
            parts.append(f"database {label}: {self._verdict[1]}")
        if not parts:
            raise CommandError(f"consumer group {options['group']!r} is not registered for "
                               "any topic", returncode=USAGE_ERROR)
        if not healthy:
            raise CommandError("; ".join(parts), returncode=UNHEALTHY)
        self.stdout.write("; ".join(parts))

    def handle_health_part(self, options: dict[str, Any]) -> None:
        """One alias's part of health over several (kept on self for the caller)."""
        self._verdict = self._health(options)

    def _health(self, options: dict[str, Any]) -> tuple[bool, str]:
        """Whether the alias ``options["database"]`` is healthy, and the line saying so."""
        max_age = None
        if options["max_age"] is not None:
            max_age = positive_seconds("--max-age", options["max_age"])
        using = options["database"]
        report = ops.health(group=options["group"], max_age=max_age, using=using)
        notes = ([] if options["group"] is not None else
                 [topic.line for topic in ops.unclaimed_topics(using=using)])
        if options["strict"]:
            notes += [f"@subscriber topic {topic!r} has never had a message (a typo of a "
                      "published topic?)" for topic in ops.silent_topics(_subscribed_topics(),
                                                                         using)]
        if not report.ok:
            return False, "; ".join([report.line, *notes])
        if notes and options["strict"]:
            return False, "unhealthy: " + "; ".join(notes)
        return True, "; ".join([report.line, *notes])

    # ----------------------------------------------------------------- dead letters

    def add_replay_arguments(self, parser: ArgumentParser) -> None:
        dead_letter_arguments(parser)

    def add_discard_arguments(self, parser: ArgumentParser) -> None:
        dead_letter_arguments(parser)

    def handle_replay(self, options: dict[str, Any]) -> None:
        self._dead_letters(options, ops.replay, "replayed")

    def handle_discard(self, options: dict[str, Any]) -> None:
        self._dead_letters(options, ops.discard, "discarded")

    def _dead_letters(self, options: dict[str, Any], action: Any, verb: str) -> None:
        flt = dead_letter_filter(options)
        if flt.topic is not None:
            refuse_dead_letter_topic(flt.topic, options["database"])
        self._known_names(options, options["database"])
        batch = batch_size_option(options["batch_size"])
        bar = ProgressBar(self.stderr, label=verb)
        done = action(flt, dry_run=options["dry_run"], batch_size=batch,
                      progress=bar.update if not options["dry_run"] else None,
                      using=options["database"])
        bar.finish()
        if done.dry_run:
            self.stdout.write(f"{done.matched} dead letter(s) match; dry run, nothing {verb}")
            for s in done.sample:
                self.stdout.write(f"  id={s.id} topic={s.topic} group={s.group} key={s.key!r} "
                                  f"attempts={s.attempts} error={s.error[:120]!r}")
            return
        line = f"{verb} {getattr(done, verb)} of {done.matched} dead letter(s)"
        if done.skipped:
            line += (f"; {done.skipped} left in place: their group is no longer registered "
                     "for the topic")
        self.stdout.write(line)

    # ----------------------------------------------------------------- pause / resume

    def add_pause_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--topic", required=True)
        parser.add_argument("--group", required=True)

    add_resume_arguments = add_pause_arguments

    def handle_pause(self, options: dict[str, Any]) -> None:
        changed = ops.pause(options["group"], options["topic"], by="manage.py sqlqueue",
                            using=options["database"])
        self.stdout.write(f"consumer group {options['group']!r} on {options['topic']!r}: "
                          + ("paused" if changed else "was paused already"))

    def handle_resume(self, options: dict[str, Any]) -> None:
        changed = ops.resume(options["group"], options["topic"], by="manage.py sqlqueue",
                             using=options["database"])
        self.stdout.write(f"consumer group {options['group']!r} on {options['topic']!r}: "
                          + ("resumed" if changed else "was not paused"))

    # ----------------------------------------------------------------- deliver-now

    def add_deliver_now_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--topic", required=True)
        parser.add_argument("--group", required=True)
        parser.add_argument("--offset", required=True, help="The message's offset.")

    def handle_deliver_now(self, options: dict[str, Any]) -> None:
        text = str(options["offset"]).strip()
        if not (text.isascii() and text.isdecimal() and int(text) > 0):
            raise CommandError(f"--offset must be a positive whole number, got {text!r}",
                               returncode=USAGE_ERROR)
        changed = ops.deliver_now(options["group"], options["topic"], int(text),
                                  by="manage.py sqlqueue", using=options["database"])
        self.stdout.write(f"message {text}: " + ("deliverable now" if changed else
                                                  "was deliverable already (or is running)"))

    # ----------------------------------------------------------------- cancel

    def add_cancel_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--topic", required=True)
        parser.add_argument("--id", required=True, help="The message's id (publish(id=...)).")
        parser.add_argument("--key", default=None,
                            help="The message's key, when the id was published under several.")
        parser.add_argument("--group", default=None,
                            help="Only this consumer group (default: every group, including "
                                 "groups that register later).")

    def handle_cancel(self, options: dict[str, Any]) -> None:
        using = options["database"]
        self._known_names({"topic": options["topic"]}, using)
        result = cancel(options["topic"], options["id"], options["group"], key=options["key"],
                        by="manage.py sqlqueue", using=using)
        groups = ", ".join(f"{group} {status}" for group, status in sorted(result.groups.items()))
        later = "groups registering later skip it" if result.for_all_groups else ""
        self.stdout.write(f"message {result.id!r} (offset {result.offset}) of {result.topic!r}: "
                          + "; ".join(part for part in (groups, later) if part))
        if not result.cancelled:
            raise CommandError("not cancelled for every group: started or handled already",
                               returncode=NOT_CANCELLED)

    # ----------------------------------------------------------------- release-leases

    def add_release_leases_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--subscriber", required=True, metavar="NAME",
                            help="The worker's --name.")
        parser.add_argument("--group", default=None, help="Only this consumer group's (with --topic).")
        parser.add_argument("--topic", default=None, help="Only this topic's (with --group).")
        parser.add_argument("--partition", default=None, metavar="N", help="Only this partition.")

    def handle_release_leases(self, options: dict[str, Any]) -> None:
        partition = options["partition"]
        if partition is not None and not (partition.isascii() and partition.isdecimal()):
            raise CommandError(f"--partition must be a partition number, got {partition!r}",
                               returncode=USAGE_ERROR)
        done = ops.release_leases(subscriber=options["subscriber"], group=options["group"],
                                  topic=options["topic"], partition=partition,
                                  using=options["database"])
        self.stdout.write(f"released {done.leases} lease(s) of {options['subscriber']!r}")

    # ----------------------------------------------------------------- gc

    def add_gc_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--topic", default=None, help="Only this topic.")

    def handle_gc(self, options: dict[str, Any]) -> None:
        self._known_names(options, options["database"])
        done = ops.run_gc(topic=options["topic"], using=options["database"])
        if not done.deleted:
            self.stdout.write("gc deleted nothing")
        for topic, count in sorted(done.deleted.items()):
            self.stdout.write(f"gc deleted {count} message(s) of {topic!r}")

    def _known_names(self, options: dict[str, Any], using: str) -> None:
        """Refuse a --topic or --group the database has never heard of (a typo)."""
        topic, group = options.get("topic"), options.get("group")
        if topic is not None and not (
                Topic.objects.using(using).filter(topic=topic).exists()
                or ConsumerOffset.objects.using(using).filter(topic=topic).exists()
                or ops.has_messages(topic, using)):  # published, no worker has seen it yet
            raise CommandError(f"unknown topic {topic!r}", returncode=USAGE_ERROR)
        if group is not None and not (
                ConsumerOffset.objects.using(using).filter(consumer_group=group).exists()
                or QueueMessage.objects.using(using).filter(consumer_group=group).exists()):
            raise CommandError(f"unknown consumer group {group!r}", returncode=USAGE_ERROR)

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
        done = ops.forget(group, topic, using=options["database"])
        self.stdout.write(
            f"forgot consumer group {done.group!r} on {', '.join(map(repr, done.topics))}: "
            f"{done.watermarks} watermark(s), {done.deliveries} delivery row(s), "
            f"{done.leases} lease(s), {done.heartbeats} heartbeat(s) deleted"
        )

    # ----------------------------------------------------------------- schedules

    def add_schedules_arguments(self, parser: ArgumentParser) -> None:
        # Strings, checked in handle_schedules(), so a bad action gets one line.
        parser.add_argument("action", nargs="?", default="list", metavar="ACTION",
                            help=f"{', '.join(SCHEDULE_ACTIONS)} (default: list).")
        parser.add_argument("name", nargs="?", default=None, metavar="NAME",
                            help="The schedule (for pause, resume and run-now).")

    def handle_schedules(self, options: dict[str, Any]) -> None:
        action, name, using = options["action"], options["name"], options["database"]
        if action not in SCHEDULE_ACTIONS:
            raise CommandError(f"unknown action {action!r}; use one of "
                               f"{', '.join(SCHEDULE_ACTIONS)}", returncode=USAGE_ERROR)
        if action == "list":
            if name is not None:
                raise CommandError("list takes no NAME", returncode=USAGE_ERROR)
            self._list_schedules(using)
            return
        if not name:
            raise CommandError(f"{action} needs the schedule's NAME", returncode=USAGE_ERROR)
        if action == "run-now":
            self.stdout.write(f"schedule {name!r}: published {ops.run_now(name, using=using)}")
        elif action == "pause":
            changed = ops.pause_schedule(name, using=using)
            self.stdout.write(f"schedule {name!r}: " + ("paused" if changed else
                                                         "was paused already"))
        else:
            changed = ops.resume_schedule(name, using=using)
            self.stdout.write(f"schedule {name!r}: " + ("resumed" if changed else
                                                         "was not paused"))

    def _list_schedules(self, using: str) -> None:
        rows = ops.list_schedules(using=using)
        if not rows:
            self.stdout.write("no schedule is defined")
            return
        tables.write_schedules(self.stdout.write, rows)


def _subscribed_topics() -> set[str]:
    """The topics of this project's @subscriber handlers (task queues left out)."""
    try:
        autodiscover()
    except ConfigurationError as exc:
        raise CommandError(str(exc)) from exc
    return {s.topic for s in subscriptions()}
