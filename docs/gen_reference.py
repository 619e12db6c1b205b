"""Generate the site's reference pages from the code, at build time (mkdocs-gen-files).

Nothing here is written by hand but the words around the tables: the settings come from
``django_sqlqueue.conf.DEFAULTS`` (its comments, the types of ``QueueSettings``) and the
ranges ``django_sqlqueue.checks`` enforces; the system checks from every ``sqlqueue.*`` id
in the package's source; the commands from their argparse parsers; the metrics from the
collectors; the API from the public modules' ``__all__`` and their docstrings
(mkdocstrings). A setting, check or command added to the code shows up here by itself.

Run by ``mkdocs build``; ``python docs/gen_reference.py OUT`` writes the pages to OUT.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_sqlqueue"
CHECK_ID = re.compile(r"sqlqueue\.[EW]\d{3}")
SETTING_IN_TEXT = re.compile(r"""SQLQUEUE\[\\?['"](\w+)\\?['"]\]""")


def setup_django() -> None:
    """A minimal configuration: the generator imports the app's modules and commands."""
    sys.path.insert(0, str(ROOT))
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth",
                            "django.contrib.admin", "django.contrib.sessions",
                            "django.contrib.messages", "django_sqlqueue"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            USE_TZ=True,
        )
        django.setup()


def code(text: Any) -> str:
    """``text`` as inline code, whatever backticks it holds."""
    text = str(text).replace("\n", " ")
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def cell(text: str) -> str:
    """``text`` in a table cell: no column breaks, and no brackets read as references."""
    return (text.replace("|", "\\|").replace("[", "\\[").replace("]", "\\]")
            .replace("\n", " "))


def check_anchor(check_id: str) -> str:
    """``sqlqueue.E002`` -> ``sqlqueue-e002``: the anchor of a check's section."""
    return check_id.lower().replace(".", "-")


def slug(text: str) -> str:
    from markdown.extensions.toc import slugify

    return str(slugify(text, "-"))


# --------------------------------------------------------------------------- settings


def setting_comments() -> dict[str, str]:
    """Each ``DEFAULTS`` key's comment in conf.py (the lines above it), and the source
    text of its default where that says more than the value (``7 * 24 * 3600.0``)."""
    source = (PACKAGE / "conf.py").read_text()
    start = source.index("DEFAULTS: dict[str, Any] = {")
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in source[start:].splitlines()[1:]:
        stripped = line.strip()
        if stripped == "}":
            break
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r'"(\w+)":', stripped)
        if match:
            comments[match.group(1)] = " ".join(pending)
            pending = []
    return comments


def default_sources() -> dict[str, str]:
    tree = ast.parse((PACKAGE / "conf.py").read_text())
    for node in tree.body:
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == "DEFAULTS" and isinstance(node.value, ast.Dict)):
            return {key.value: ast.unparse(value) for key, value in
                    zip(node.value.keys, node.value.values, strict=True)
                    if isinstance(key, ast.Constant)}
    raise SystemExit("conf.py: no DEFAULTS dict found")


DOC_MENTION = re.compile(r'docs/([\w-]+)\.md(?:, "([^"]+)")?')


def link_docs(text: str) -> str:
    """``docs/operating.md, "Read replicas"`` in a comment -> a link to that section."""
    def link(match: re.Match[str]) -> str:
        page, section = match.group(1), match.group(2)
        if section:
            return f"[{section}](../{page}.md#{slug(section)})"
        return f"[{page}](../{page}.md)"

    return DOC_MENTION.sub(link, text)


def settings_page(checks: dict[str, dict[str, Any]]) -> str:
    from django_sqlqueue import checks as checks_module
    from django_sqlqueue.conf import DEFAULTS, QueueSettings

    types = {field.name.upper(): str(field.type) for field in dataclasses.fields(QueueSettings)}
    rules = {name: (check_id, expected) for name, check_id, _, expected in checks_module._RULES}
    comments = setting_comments()
    sources = default_sources()
    missing = [name for name in DEFAULTS if not comments.get(name)]
    if missing:
        raise SystemExit(f"conf.py: DEFAULTS key(s) without a comment: {', '.join(missing)}")
    by_setting: dict[str, list[str]] = {}
    for check_id, check in checks.items():
        for name in check["settings"]:
            by_setting.setdefault(name, []).append(check_id)
    lines = [
        "# Settings",
        "",
        "Every key of the `SQLQUEUE` dict in your settings, with its type, default and the",
        "values it accepts. Leave a key out to use its default. `manage.py check` (and so",
        "`runqueueworker` and `manage.py sqlqueue`, which refuse to start while one fails)",
        "reports each bad value with the [system check](checks.md) named here.",
        "",
        "```python",
        "# settings.py",
        "SQLQUEUE = {",
        '    "MAX_ATTEMPTS": 10,',
        '    "TOPICS": {"orders": {"PARTITIONS": 64}},',
        "}",
        "```",
        "",
        "A number of seconds is an `int` or a `float`: not a string, a `bool`, NaN or",
        "infinity. Settings are read each time they are used, so `override_settings` works",
        "in tests.",
        "",
        "| setting | type | default |",
        "| --- | --- | --- |",
    ]
    for name, value in DEFAULTS.items():
        lines.append(f"| [`{name}`](#{name.lower()}) | {code(types[name])} | {code(repr(value))} |")
    for name, value in DEFAULTS.items():
        check_ids = sorted(set(by_setting.get(name, [])) | ({rules[name][0]} if name in rules else set()))
        lines += ["", f"## `{name}` {{#{name.lower()}}}", "", link_docs(comments[name]), "",
                  "| | |", "| --- | --- |",
                  f"| type | {code(types[name])} |"]
        shown = repr(value)
        if sources[name] not in (shown, name) and not sources[name].isupper():
            shown = f"{shown} ({sources[name]})"
        lines.append(f"| default | {code(shown)} |")
        if name in rules:
            lines.append(f"| accepts | {cell(rules[name][1])} |")
        if check_ids:
            links = ", ".join(f"[{c}](checks.md#{check_anchor(c)})" for c in check_ids)
            lines.append(f"| checked by | {links} |")
    lines += ["", "`TOPICS` entries take these options: "
              + ", ".join(code(o) for o in sorted(_topic_options())) + "."]
    return "\n".join(lines) + "\n"


def _topic_options() -> frozenset[str]:
    from django_sqlqueue.conf import TOPIC_OPTIONS

    return TOPIC_OPTIONS


# --------------------------------------------------------------------------- system checks


class _Renderer:
    """Message and hint templates from the source: literal text, ``{expression}`` for
    what is filled in at run time, and a link for each ``see(page, section)``."""

    def __init__(self, module: ast.Module, runtime: Any = None) -> None:
        self.module = module
        self.runtime = runtime  # the imported module: its constants fill the templates

    def render(self, node: ast.AST | None, scope: ast.AST | None = None) -> str:
        if node is None:
            return ""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(
                str(part.value) if isinstance(part, ast.Constant) else
                self._filled(part.value, scope)  # type: ignore[attr-defined]
                for part in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.render(node.left, scope) + self.render(node.right, scope)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "see" and all(isinstance(a, ast.Constant) for a in node.args)):
            page, section = (a.value for a in node.args)  # type: ignore[attr-defined]
            return f"See [{section}](../{page}.md#{slug(section)})."
        if isinstance(node, ast.Name):
            assigned = self._assigned(node.id, scope) or self._assigned(node.id, self.module)
            if assigned is not None:
                return self.render(assigned, scope)
        return "{" + ast.unparse(node) + "}"

    def _filled(self, node: ast.AST, scope: ast.AST | None) -> str:
        """A replacement field: a local template or a module constant when it names one,
        else ``{expression}``."""
        if isinstance(node, ast.Name):
            local = self._assigned(node.id, scope)
            if isinstance(local, ast.Constant | ast.JoinedStr):
                return self.render(local, scope)
            if local is None:
                value = getattr(self.runtime, node.id, None)
                if isinstance(value, str | int | float) and not isinstance(value, bool):
                    return str(value)
        return "{" + ast.unparse(node) + "}"

    @staticmethod
    def _assigned(name: str, scope: ast.AST | None) -> ast.AST | None:
        if scope is None:
            return None
        for node in ast.walk(scope):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name):
                return node.value
        return None


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.FunctionDef | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef):
            return node
    return None


def _is_deploy_check(function: ast.FunctionDef | None) -> bool:
    return function is not None and any(
        isinstance(d, ast.Call) and any(k.arg == "deploy" for k in d.keywords)
        for d in function.decorator_list)


def collect_checks() -> dict[str, dict[str, Any]]:
    """Every ``sqlqueue.E…``/``W…`` id the package reports, with its message and hint
    templates, where it is reported, and the ``SQLQUEUE`` keys those name."""
    from django_sqlqueue import checks as checks_module

    found: dict[str, dict[str, Any]] = {}

    def entry(check_id: str) -> dict[str, Any]:
        return found.setdefault(check_id, {"messages": [], "hints": [], "where": [],
                                           "docs": [], "deploy": False, "settings": set()})

    for name, check_id, _, expected in checks_module._RULES:
        item = entry(check_id)
        item["messages"].append(f"SQLQUEUE['{name}'] must be {expected}, got {{value}}.")
        item["hints"].append("Fix the value or remove the key to use the default.")
        item["settings"].add(name)
        item["where"].append("django_sqlqueue/checks.py: check_settings")
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        source = path.read_text()
        if not CHECK_ID.search(source):
            continue
        tree = ast.parse(source)
        parents = _parents(tree)
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        renderer = _Renderer(tree, importlib.import_module(dotted))
        named = {node.targets[0].id: node.value.value for node in ast.walk(tree)
                 if isinstance(node, ast.Assign) and len(node.targets) == 1
                 and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
                 and isinstance(node.value.value, str) and CHECK_ID.fullmatch(node.value.value)}
        relative = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            check_id, message, hint = None, None, None
            if isinstance(node, ast.Call):
                ids = [k.value for k in node.keywords if k.arg == "id"]
                if ids and isinstance(ids[0], ast.Constant) and CHECK_ID.fullmatch(str(ids[0].value)):
                    check_id = ids[0].value
                    message = node.args[0] if node.args else None
                    hint = next((k.value for k in node.keywords if k.arg == "hint"), None)
            elif isinstance(node, ast.Tuple) and len(node.elts) == 2:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and CHECK_ID.fullmatch(str(first.value)):
                    check_id = first.value
                elif isinstance(first, ast.Name) and first.id in named:
                    check_id = named[first.id]
                message = node.elts[1] if check_id else None
            if check_id is None:
                continue
            function = _enclosing_function(node, parents)
            item = entry(str(check_id))
            text = renderer.render(message, function)
            if text and text not in item["messages"]:
                item["messages"].append(text)
            hint_text = renderer.render(hint, function) if hint is not None else ""
            if hint_text and hint_text not in item["hints"]:
                item["hints"].append(hint_text)
            where = f"{relative}: {function.name}" if function else relative
            if where not in item["where"]:
                item["where"].append(where)
            doc = ast.get_docstring(function) if function else None
            if doc and doc not in item["docs"]:
                item["docs"].append(doc)
            item["deploy"] = item["deploy"] or _is_deploy_check(function)
            item["settings"].update(SETTING_IN_TEXT.findall(text))
    from django_sqlqueue.conf import DEFAULTS

    for item in found.values():
        if (any(w.startswith("django_sqlqueue/scheduling/") for w in item["where"])
                or any(m.startswith("schedule ") for m in item["messages"])):
            item["settings"].add("SCHEDULES")
        item["settings"] &= set(DEFAULTS)
    wordless = [check_id for check_id, item in found.items() if not item["messages"]]
    if wordless:
        raise SystemExit(f"no message found for the system check(s) {', '.join(wordless)}: "
                         "docs/gen_reference.py reads a check's message from Error(...)/"
                         "Warning(...) or an (id, message) pair")
    return dict(sorted(found.items()))


def checks_page(checks: dict[str, dict[str, Any]]) -> str:
    lines = [
        "# System checks",
        "",
        "`manage.py check` runs these and reports every problem at once, each with a hint;",
        "`runqueueworker` and `manage.py sqlqueue` run them first and refuse to start while",
        "an error (`E`) is reported. Warnings (`W`) do not stop anything. A check marked",
        "*deployment* runs only with `manage.py check --deploy`.",
        "",
        "Each section shows the messages as the code words them: `{…}` stands for what is",
        "filled in at run time (the value found, an alias, a name).",
        "",
        "| id | level | about |",
        "| --- | --- | --- |",
    ]
    for check_id, item in checks.items():
        level = "warning" if check_id.split(".")[1].startswith("W") else "error"
        about = ", ".join(f"`{s}`" for s in sorted(item["settings"])) or _subject(item)
        lines.append(f"| [{check_id}](#{check_anchor(check_id)}) | {level} | {cell(about)} |")
    for check_id, item in checks.items():
        level = "Warning" if check_id.split(".")[1].startswith("W") else "Error"
        kind = f"{level}, deployment check" if item["deploy"] else level
        lines += ["", f"## {check_id} {{#{check_anchor(check_id)}}}", "", f"*{kind}.*", ""]
        if item["settings"]:
            lines.append("About " + ", ".join(f"[`{s}`](settings.md#{s.lower()})"
                                              for s in sorted(item["settings"])) + ".")
        lines += ["", "Reported as:", ""]
        lines += [f"- {code(m)}" for m in item["messages"]]
        if item["hints"]:
            lines += ["", "Hint:", ""]
            lines += [f"- {_hint(h)}" for h in item["hints"]]
        if item["docs"]:
            lines += ["", "What it guards:", ""]
            lines += [f"> {' '.join(d.split())}" for d in item["docs"]]
        lines += ["", "Reported by " + "; ".join(code(w) for w in item["where"]) + "."]
    return "\n".join(lines) + "\n"


def _subject(item: dict[str, Any]) -> str:
    """What a check that names no ``SQLQUEUE`` key is about, from where it is reported."""
    where = " ".join(item["where"])
    text = " ".join(item["messages"])
    for subject, found in (("TASKS", "django_sqlqueue/tasks/" in where),
                           ("SCHEDULES", "SCHEDULES" in text or "scheduling/" in where),
                           ("DATABASES", "DATABASES" in text),
                           ("SQLQUEUE", text.startswith("SQLQUEUE"))):
        if found:
            return f"`{subject}`"
    return ""


def _hint(hint: str) -> str:
    """A hint as text: its ``see()`` link kept a link, the rest as code."""
    match = re.search(r"See \[[^\]]+\]\([^)]+\)\.$", hint)
    if match is None:
        return code(hint)
    rest = hint[:match.start()].strip()
    return (code(rest) + " " if rest else "") + match.group(0)


# --------------------------------------------------------------------------- commands

COMMON_OPTIONS = {"help", "version", "verbosity", "settings", "pythonpath", "traceback",
                  "no_color", "force_color", "skip_checks"}


def _options(parser: Any) -> Iterator[tuple[str, str, str, str]]:
    """(flags, how many times, default, help) of each option and argument of ``parser``."""
    import argparse

    for action in parser._actions:
        if action.dest in COMMON_OPTIONS or isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            flags = ", ".join(action.option_strings)
            if action.nargs != 0:
                flags += f" {action.metavar or action.dest.upper()}"
        else:
            flags = action.metavar or action.dest.upper()
        repeat = "repeatable" if isinstance(action, argparse._AppendAction) else (
            "required" if action.required else "")
        default = action.default
        shown = "" if default in (None, False, [], argparse.SUPPRESS) else repr(default)
        help_text = (action.help or "").replace("%%", "%")
        yield flags, repeat, shown, help_text


def _option_table(parser: Any) -> list[str]:
    rows = list(_options(parser))
    if not rows:
        return ["No options of its own."]
    lines = ["| option | | default | meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| {code(f)} | {r} | {code(d) if d else ''} | {cell(h)} |" for f, r, d, h in rows]
    return lines


def exit_codes() -> dict[str, list[tuple[int, str]]]:
    """The exit statuses of each command: the values are the code's constants."""
    from django_sqlqueue.management import connecting, failures
    from django_sqlqueue.management.commands import runqueueworker as rqw
    from django_sqlqueue.management.commands import sqlqueue as sq
    from django_sqlqueue.worker import interrupts, process, startup

    return {
        "runqueueworker": [
            (0, "stopped: by SIGTERM or SIGINT once its handlers finished, or with `--burst` "
                "once nothing was left to deliver"),
            (interrupts.IMMEDIATE_EXIT_STATUS, "a second SIGTERM or SIGINT ended it at once "
                "(its in-flight messages are redelivered after their visibility timeout)"),
            (startup.NOT_MIGRATED_STATUS, "`--burst` on a database whose queue tables are "
                "missing or behind the migrations (without `--burst` it waits for `migrate`)"),
            (1, "the engine for one of its databases crashed (the log has the traceback)"),
            (connecting.UNREACHABLE, "the database refused it at start (wrong credentials, "
                "no access, an unknown database); a database that is down is waited for"),
            (rqw.USAGE_ERROR, "bad options or a refusal: one line on stderr, never a usage "
                "screen"),
            (process.EXIT_HANDLERS_ABANDONED, "stopped with handlers still running after "
                "`SHUTDOWN_GRACE` (their messages are redelivered)"),
        ],
        "sqlqueue": [
            (0, "done; `health`: every (or the named) group is healthy; `cancel`: cancelled "
                "for every group asked"),
            (sq.UNHEALTHY, "`health`: a condition failed (the line names each)"),
            (sq.NOT_CANCELLED, "`cancel`: some group had started or handled the message"),
            (failures.NOT_MIGRATED, "the queue tables are missing or behind the migrations (the "
                "line names `manage.py migrate`)"),
            (connecting.UNREACHABLE, "the database could not be reached within `--wait`, or "
                "was lost in the middle of the subcommand"),
            (failures.USAGE_ERROR, "bad input or a refused operation: one line on stderr, never a "
                "traceback or a usage screen"),
        ],
    }


def _exit_rows(codes: list[tuple[int, str]]) -> list[str]:
    """One table row per status, its meanings joined: several constants share a value."""
    meanings: dict[int, list[str]] = {}
    for status, text in codes:
        meanings.setdefault(status, []).append(text)
    return [f"| {status} | {cell('; '.join(texts))} |" for status, texts in sorted(meanings.items())]


def commands_page() -> str:
    import argparse

    from django.core.management import load_command_class

    lines = [
        "# Commands and exit codes",
        "",
        "Both commands are Django management commands (`python manage.py …`). Besides the",
        "options below they take Django's own (`--settings`, `--pythonpath`, `-v`/`--verbosity`,",
        "`--traceback`, `--no-color`, `--force-color`, `--skip-checks`). Each runs the",
        "[system checks](checks.md) first.",
    ]
    codes = exit_codes()
    worker = load_command_class("django_sqlqueue", "runqueueworker")
    parser = worker.create_parser("manage.py", "runqueueworker")
    lines += ["", "## runqueueworker {#runqueueworker}", "", str(worker.help), "",
              "```console", "python manage.py runqueueworker [options]", "```", ""]
    lines += _option_table(parser)
    lines += ["", "### Exit codes {#runqueueworker-exit-codes}", "", "| status | meaning |",
              "| --- | --- |"]
    lines += _exit_rows(codes["runqueueworker"])
    command = load_command_class("django_sqlqueue", "sqlqueue")
    parser = command.create_parser("manage.py", "sqlqueue")
    lines += ["", "## sqlqueue {#sqlqueue}", "", str(command.help), "",
              "```console", "python manage.py sqlqueue SUBCOMMAND [options]", "```", "",
              "| subcommand | what it does |", "| --- | --- |"]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, subparser in subparsers.choices.items():
        lines.append(f"| [`{name}`](#sqlqueue-{name}) | {cell(subparser.description or '')} |")
    lines += ["", "### Exit codes {#sqlqueue-exit-codes}", "", "| status | meaning |",
              "| --- | --- |"]
    lines += _exit_rows(codes["sqlqueue"])
    for name, subparser in subparsers.choices.items():
        lines += ["", f"### sqlqueue {name} {{#sqlqueue-{name}}}", "",
                  subparser.description or "", "", "```console",
                  f"python manage.py sqlqueue {name} [options]", "```", ""]
        lines += _option_table(subparser)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- metrics


def metrics_page() -> str:
    from django_sqlqueue.metrics.database import GAUGES, LIMIT_GAUGES
    from django_sqlqueue.metrics.worker import WorkerMetrics

    metrics = WorkerMetrics()
    metrics.watch_leases(list)
    worker_rows = []
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        collector = metrics.registry._names_to_collectors.get(name) or \
            metrics.registry._names_to_collectors.get(family.name)
        # A custom collector's family names its labels; a client library metric's own
        # object does (prometheus-client keeps both as _labelnames).
        labels = list(getattr(family, "_labelnames", ()) or getattr(collector, "_labelnames", ()))
        worker_rows.append((name, family.type, labels, family.documentation))
    lines = [
        "# Metrics",
        "",
        "Prometheus metrics, with the `metrics` extra (`pip install 'django-sqlqueue[metrics]'`).",
        "Every name starts with `sqlqueue_`, uses base units (seconds) and carries only the",
        "labels shown: never a message id, key or offset.",
        "[Operating the queue](../operating.md#metrics-prometheus) shows how to scrape them",
        "and which alerts to set.",
        "",
        "## A worker's own metrics {#worker-metrics}",
        "",
        "Served by `runqueueworker --metrics-port PORT` (on 127.0.0.1 unless",
        "`--metrics-address` says otherwise): what that one worker process did.",
        "",
        "| metric | type | labels | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for name, kind, labels, text in worker_rows:
        lines.append(f"| [`{name}`](#{name}) | {kind} | {', '.join(labels)} | {cell(text)} |")
    lines += [
        "",
        "## Gauges read from the database {#database-metrics}",
        "",
        "Served by the metrics view (`include(\"django_sqlqueue.urls\")`, guarded by",
        "[`METRICS_TOKEN`](settings.md#metrics_token)), read at most once per",
        "[`METRICS_CACHE_SECONDS`](settings.md#metrics_cache_seconds) per process, from",
        "[`READ_DATABASE`](settings.md#read_database) when set. With topics on several",
        "databases (`TOPICS`), each row also carries a `database` label.",
        "",
        "| metric | type | labels | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for name, text, _ in GAUGES:
        lines.append(f"| [`{name}`](#{name}) | gauge | group, topic | {cell(text)} |")
    for name, text, _ in LIMIT_GAUGES:
        lines.append(f"| [`{name}`](#{name}) | gauge | scope | {cell(text)} |")
    for name, kind, labels, text in worker_rows:
        lines += _metric_section(name, kind, labels, text, "a worker's `--metrics-port`")
    for name, text, _ in GAUGES:
        lines += _metric_section(name, "gauge", ["group", "topic"], text, "the metrics view")
    for name, text, _ in LIMIT_GAUGES:
        lines += _metric_section(name, "gauge", ["scope"], text, "the metrics view")
    return "\n".join(lines) + "\n"


def _metric_section(name: str, kind: str, labels: list[str], text: str, where: str) -> list[str]:
    return ["", f"### `{name}` {{#{name}}}", "", text, "",
            f"Type {kind}; labels {', '.join(f'`{label}`' for label in labels) or 'none'}; "
            f"served by {where}."]


# --------------------------------------------------------------------------- API

API_MODULES = {
    "django_sqlqueue": "Publishing, subscribing, cancelling, and the exceptions: "
                       "`import django_sqlqueue as sqlqueue`.",
    "django_sqlqueue.schedules": "Recurring schedules at run time (besides `SQLQUEUE[\"SCHEDULES\"]`).",
    "django_sqlqueue.tasks": "The backend of Django's Tasks framework.",
    "django_sqlqueue.testing": "Test helpers: what a block publishes, and running handlers "
                               "and tasks inside a test.",
    "django_sqlqueue.operations": "What the admin's actions and `manage.py sqlqueue` do, as "
                                  "Python functions.",
}
# Public modules without ``__all__``: shown whole, from the module's docstring down.
WHOLE_MODULES = {
    "django_sqlqueue.signals": "Signals the worker and replays send.",
    "django_sqlqueue.routers": "The queue's tables on a database of their own.",
}


def api_page() -> str:
    import importlib

    lines = ["# Python API", "",
             "What a project imports, module by module, from the code's docstrings. Anything",
             "not listed here is private and may change."]
    for module_name, text in API_MODULES.items():
        module = importlib.import_module(module_name)
        lines += ["", f"## `{module_name}` {{#{slug(module_name)}}}", "", text, ""]
        for name in sorted(module.__all__, key=lambda n: (not n[0].islower(), n.lower())):
            if isinstance(getattr(module, name), type(sys)):
                continue  # a module of its own (django_sqlqueue.schedules): its own section
            lines += [f"::: {module_name}.{name}", ""]
    for module_name, text in WHOLE_MODULES.items():
        lines += ["", f"## `{module_name}` {{#{slug(module_name)}}}", "", text, "",
                  f"::: {module_name}", "    options:", "      show_root_heading: false",
                  "      show_if_no_docstring: true", "      heading_level: 3", ""]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- output


# The reference pages split into a page per item: a setting, a system check, a command.
SPLIT = ("settings", "checks", "commands")
_SECTION_RE = re.compile(r"^## (.*?) \{#([\w-]+)\}$", re.M)
_LINK_RE = re.compile(r"\]\((?:(settings|checks|commands|metrics|api)\.md)?#([\w-]+)\)")


def pages() -> dict[str, str]:
    setup_django()
    checks = collect_checks()
    whole = {
        "settings": settings_page(checks),
        "checks": checks_page(checks),
        "commands": commands_page(),
        "metrics": metrics_page(),
        "api": api_page(),
    }
    # Where each "## … {#anchor}" section of a split page now is: a page of its own.
    homes = {(name, anchor): f"{name}/{anchor}.md" for name in SPLIT
             for _, anchor in _SECTION_RE.findall(whole[name])}
    out: dict[str, str] = {}
    for name, text in whole.items():
        if name not in SPLIT:
            out[f"reference/{name}.md"] = _relink(text, name, "", homes)
            continue
        head, *sections = re.split(r"(?m)^(?=## .* \{#[\w-]+\}$)", text)
        out[f"reference/{name}.md"] = _relink(head + _index(name, sections), name, "", homes)
        for section in sections:
            match = _section(section)
            title, anchor = match.groups()
            # One level deeper than the index: links out of the reference climb one more.
            body = re.sub(r"(?m)^### ", "## ", section[match.end():]).replace("](../", "](../../")
            out[f"reference/{name}/{anchor}.md"] = _relink(f"# {title}\n{body}", name, "../",
                                                            homes)
    return out


def _section(text: str) -> re.Match[str]:
    match = _SECTION_RE.match(text)
    if match is None:
        raise SystemExit(f"gen_reference: a section without a heading and anchor: {text[:60]!r}")
    return match


def _index(name: str, sections: list[str]) -> str:
    """What the index of a split page lists when its head has no table of its items."""
    if name != "commands":
        return ""
    lines = ["", "| command | |", "| --- | --- |"]
    for section in sections:
        match = _section(section)
        lines.append(f"| [`{match.group(1)}`](#{match.group(2)}) | |")
    return "\n".join(lines) + "\n"


def _relink(text: str, page: str, up: str, homes: dict[tuple[str, str], str]) -> str:
    """Point ``[…](page.md#anchor)`` and ``[…](#anchor)`` links at where the anchor now is:
    a page of its own, or a section of a page that was not split."""
    def target(match: re.Match[str]) -> str:
        linked = match.group(1) or page
        anchor = match.group(2)
        if (linked, anchor) in homes:
            return f"]({up}{homes[(linked, anchor)]})"
        if not match.group(1):
            return match.group(0)  # a section of this very page
        return f"]({up}{linked}.md#{anchor})"
    return _LINK_RE.sub(target, text)


def main() -> None:
    if "mkdocs_gen_files" not in sys.modules:  # by hand: python docs/gen_reference.py OUT
        out = Path(sys.argv[1])
        for path, text in pages().items():
            (out / path).parent.mkdir(parents=True, exist_ok=True)
            (out / path).write_text(text)
        return
    import mkdocs_gen_files

    for path, text in pages().items():
        with mkdocs_gen_files.open(path, "w") as page:
            page.write(text)
        mkdocs_gen_files.set_edit_path(path, "gen_reference.py")


if __name__ in {"__main__", "<run_path>"}:
    main()
