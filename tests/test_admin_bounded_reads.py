"""What a query string can make the admin read: each page's own order, its declared filters
and search box, and counts bounded per page view, on every backend.

The pages are read from the admin's registry, so a page added later is checked too.
"""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_sqlqueue import publish, schedules
from django_sqlqueue.models import ConsumerOffset, QueueMessage, Schedule, Topic
from django_sqlqueue.sequencing import sequence_all
from tests.admin_fixtures import client_for, dead_letter, staff

pytestmark = pytest.mark.django_db

APP = "django_sqlqueue"
MESSAGES = reverse("admin:django_sqlqueue_queuemessage_changelist")
DEAD_LETTERS = reverse("admin:django_sqlqueue_deadletter_changelist")
PARTITIONS = reverse("admin:django_sqlqueue_partition_changelist")
# What a scan of a whole table looks like in SQL, on any of the three backends.
SCANNING = re.compile(r"\bLIKE\b|\bREGEXP\b|\s~\*?\s|\bREGEXP_LIKE\b", re.IGNORECASE)


def app_admins() -> list[tuple[str, admin.ModelAdmin]]:
    """(changelist URL, ModelAdmin) of every admin page of the app."""
    pages = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label == APP:
            pages.append((reverse(f"admin:{APP}_{model._meta.model_name}_changelist"),
                          model_admin))
    return sorted(pages, key=lambda page: page[0])


def viewer():
    return client_for(staff("viewer", "view_deadletter", "view_queuemessage", "view_overview",
                            "view_partition", "view_subscriber", "view_schedule"))


@pytest.fixture
def rows() -> None:
    """A little of everything the pages list."""
    dead_letter(payload={"note": "alert"}, key="k1", error="RuntimeError: x")
    publish("orders", {"n": 2}, key="k2")
    sequence_all()
    schedules.add("nightly", cron="0 3 * * *", topic="orders", payload={})


def statements(client, url: str) -> tuple[int, list[str]]:
    """The status of a GET and its SQL, numbers left out (the pages bind the database
    clock's time into some reads)."""
    with CaptureQueriesContext(connection) as captured:
        status = client.get(url).status_code
    return status, [re.sub(r"\d+", "N", q["sql"]) for q in captured.captured_queries]


def table_of(model_admin: admin.ModelAdmin) -> str:
    return model_admin.model._meta.db_table


def test_every_admin_page_of_the_app_takes_the_bounded_changelist():
    from django_sqlqueue.admin.bounded import BoundedChangeList, QueueModelAdmin

    pages = app_admins()
    assert len(pages) == 6
    for url, model_admin in pages:
        assert isinstance(model_admin, QueueModelAdmin), url
        assert model_admin.get_changelist(None) is BoundedChangeList, url


@pytest.mark.parametrize("order", ["0", "1", "2", "3", "4", "5", "6", "7", "8", "-1.4",
                                   "4.-2", "-0"])
def test_ordering_from_the_query_string_leaves_every_pages_sql_as_it_is(rows, order):
    client = viewer()
    for url, model_admin in app_admins():
        client.get(url)  # sessions, content types: warm caches
        plain_status, plain = statements(client, url)
        status, sql = statements(client, f"{url}?o={order}")
        assert plain_status == 200, url
        if status == 400:
            assert not [s for s in sql if table_of(model_admin) in s], url
        else:
            assert status == 200 and sql == plain, (url, order)


def lookups(model_admin: admin.ModelAdmin) -> list[str]:
    """A lookup on every column of the page's model (exact, regex, contains), but for the
    parameters of the page's own filters."""
    declared = {getattr(f, "parameter_name", f) for f in model_admin.list_filter}
    names = [f.name for f in model_admin.model._meta.concrete_fields]
    return [f"{name}{lookup}" for name in names for lookup in ("", "__regex", "__icontains")
            if f"{name}{lookup}" not in declared]


def test_lookups_outside_the_declared_filters_are_refused_before_any_read(rows):
    client = viewer()
    for url, model_admin in app_admins():
        client.get(url)
        _, plain = statements(client, url)
        for lookup in lookups(model_admin):
            status, sql = statements(client, f"{url}?{lookup}=%28x%2B%29%2By")
            table = table_of(model_admin)
            assert not [s for s in sql if table in s and SCANNING.search(s)], (url, lookup)
            if status == 400:  # refused as Django refuses a disallowed lookup
                assert not [s for s in sql if table in s], (url, lookup)
            else:  # a page of its own that does not read such parameters at all
                assert status == 200 and sql == plain, (url, lookup, status)


@pytest.mark.parametrize("query", [
    "?message_key__regex=^(a|aa)*b$", "?payload__icontains=alert", "?topic__startswith=ord",
    "?offset__gt=0", "?o=4&payload__contains=a"])
def test_the_log_refuses_what_its_filters_do_not_take(rows, query):
    with CaptureQueriesContext(connection) as captured:
        response = viewer().get(MESSAGES + query)
    assert response.status_code == 400
    assert not [q["sql"] for q in captured.captured_queries if "queue_messages" in q["sql"]]


@pytest.mark.parametrize("query", [
    "?last_error__iregex=(x%2B)%2By", "?payload__icontains=alert", "?metadata__contains=a",
    "?original_topic__in=orders,x", "?consumer_group__icontains=bill"])
def test_the_dead_letters_refuse_what_their_filters_and_search_do_not_take(rows, query):
    with CaptureQueriesContext(connection) as captured:
        response = viewer().get(DEAD_LETTERS + query)
    assert response.status_code == 400
    assert not [q["sql"] for q in captured.captured_queries if "queue_messages" in q["sql"]]


def listed(response) -> list[str]:
    return sorted(str(obj.pk) for obj in response.context["cl"].result_list)


def test_the_declared_filters_and_search_boxes_still_work(rows):
    client = viewer()
    letter = QueueMessage.objects.filter(failed_at__gt=0).get()
    plain = QueueMessage.objects.get(topic="orders", message_key="k2")
    for url, expected in [
        (f"{MESSAGES}?topic=orders&partition={plain.partition_key}&o=2", {plain.offset}),
        (f"{MESSAGES}?q={plain.offset}", {plain.offset}),
        (f"{DEAD_LETTERS}?original_topic=orders&consumer_group=billing&failed=24h",
         {letter.offset}),
        (f"{DEAD_LETTERS}?q=alert&o=1", set()),  # error text; the payload is not searched
        (f"{DEAD_LETTERS}?q=note%3Dalert", {letter.offset}),  # a payload field
        (f"{DEAD_LETTERS}?q=RuntimeError", {letter.offset}),
    ]:
        response = client.get(url)
        assert response.status_code == 200, url
        assert listed(response) == sorted(str(o) for o in expected), url
    schedules_url = reverse("admin:django_sqlqueue_schedule_changelist")
    Schedule.objects.filter(name="nightly").update(paused=True)
    for query in ("?paused__exact=1", "?origin=api", "?q=night", "?paused__exact=1&o=3"):
        response = client.get(schedules_url + query)
        assert response.status_code == 200, query
        assert listed(response) == ["nightly"], query


# --------------------------------------------------------------------------- partitions


def progress_limits(sql: list[str]) -> list[int]:
    """The LIMIT of every capped count the page ran (COUNT over a LIMITed subquery)."""
    return [int(n) for s in sql for n in re.findall(r"LIMIT (\d+)\) (?:AS )?\W?capped", s)]


def test_the_partitions_page_counts_lag_within_one_budget_per_view(db):
    from django_sqlqueue.admin.pages import LAG_BUDGET

    for n in range(30):
        publish("orders", {"n": n}, key=f"k{n}")
    sequence_all()
    partitions = [str(p) for p in range(12)]
    for group in ("billing", "shipping", "audit"):
        ConsumerOffset.objects.ensure(group, "orders", partitions, using="default")
    client = viewer()
    client.get(PARTITIONS)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(PARTITIONS)
    assert response.status_code == 200 and len(response.context["rows"]) == 36
    sql = [q["sql"] for q in captured.captured_queries]
    limits = progress_limits(sql)
    assert len(limits) == 36, sql  # one capped count per row shown
    assert sum(limits) <= LAG_BUDGET
    counts = [s for s in sql if "COUNT(" in s.upper()]
    assert counts and all("LIMIT" in s.upper() for s in counts), counts
    assert len(sql) <= 12, sql  # a fixed number of statements, whatever the rows
    # One group's one topic: the budget goes to fewer partitions, each counted further.
    with CaptureQueriesContext(connection) as narrowed:
        client.get(PARTITIONS, {"group": "billing", "topic": "orders"})
    few = progress_limits([q["sql"] for q in narrowed.captured_queries])
    assert len(few) == 12 and min(few) > max(limits) and sum(few) <= LAG_BUDGET


def test_a_lag_beyond_the_pages_share_of_the_budget_shows_as_more_than(db, monkeypatch):
    from django_sqlqueue.admin import pages

    monkeypatch.setattr(pages, "LAG_BUDGET", 24)
    for n in range(5):
        publish("slow", {"n": n})  # one partition
    sequence_all()
    ConsumerOffset.objects.ensure("billing", "slow", ["0"], using="default")
    ConsumerOffset.objects.ensure("billing", "orders", [str(p) for p in range(11)],
                                  using="default")
    client = viewer()
    response = client.get(PARTITIONS)
    row = next(r for r in response.context["rows"] if r["topic"] == "slow")
    assert row["lag"] == 2 and row["lag_capped"]  # 24 shared by 12 rows
    assert 'class="num lag sqlqueue-bad">2+</td>' in response.content.decode()
    narrowed = client.get(PARTITIONS, {"topic": "slow"})
    assert [(r["lag"], r["lag_capped"]) for r in narrowed.context["rows"]] == [(5, False)]


# --------------------------------------------------------------------------- filter choices


def test_filter_choices_are_bounded_and_a_name_in_the_url_still_filters(db):
    from django_sqlqueue.admin.filters import CHOICES

    Topic.objects.bulk_create([Topic(topic=f"t{n:04d}", partitions=1) for n in range(CHOICES + 50)])
    stored = publish("zz-unrecorded", {"n": 1})
    client = viewer()
    with CaptureQueriesContext(connection) as captured:
        page = client.get(MESSAGES)
    [spec] = [f for f in page.context["cl"].filter_specs if f.parameter_name == "topic"]
    assert len(spec.lookup_choices) == CHOICES
    assert "sqlqueue-more-choices" in page.content.decode()
    reads = [q["sql"] for q in captured.captured_queries if "queue_topics" in q["sql"]]
    assert reads and all("LIMIT" in s.upper() for s in reads), reads
    chosen = client.get(MESSAGES, {"topic": "zz-unrecorded"})
    [spec] = [f for f in chosen.context["cl"].filter_specs if f.parameter_name == "topic"]
    assert ("zz-unrecorded", "zz-unrecorded") in spec.lookup_choices
    assert listed(chosen) == [str(stored.offset)]


def test_the_dead_letters_topic_filter_offers_the_topics_that_have_dead_letters(db):
    dead_letter(topic="orders")
    Topic.objects.record({"quiet": 4, "invoices": 4}, using="default")
    ConsumerOffset.objects.ensure("billing", "quiet", ["0"], using="default")
    response = viewer().get(DEAD_LETTERS)
    [spec] = [f for f in response.context["cl"].filter_specs
              if f.parameter_name == "original_topic"]
    assert [name for name, _ in spec.lookup_choices] == ["orders"]
    assert "sqlqueue-more-choices" not in response.content.decode()


def test_the_partitions_pages_choices_are_bounded(db):
    from django_sqlqueue.admin.filters import CHOICES

    for n in range(CHOICES + 20):
        ConsumerOffset.objects.ensure(f"g{n:04d}", "orders", ["0"], using="default")
    response = viewer().get(PARTITIONS, {"group": "g9999"})
    assert len(response.context["groups"]) == CHOICES + 1  # the one asked for, too
    assert "g9999" in response.context["groups"]
    assert response.context["topics"] == ["orders"]
