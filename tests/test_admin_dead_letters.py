"""The dead letters changelist: columns, filters, search, detail page, permissions."""

from __future__ import annotations

import html
import time
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_sqlqueue.models import DeadLetter, QueueMessage
from tests.admin_fixtures import client_for, dead_letter, staff

pytestmark = pytest.mark.django_db

URL = reverse("admin:django_sqlqueue_deadletter_changelist")


def listed(response) -> list[int]:
    """The offsets of the dead letters on a changelist page."""
    return sorted(int(obj.offset) for obj in response.context["cl"].result_list)


def test_the_changelist_shows_topic_group_key_attempts_first_error_line_and_failure(
        admin_client):
    letter = dead_letter(key="order-7", error="RuntimeError: card declined\nTraceback ...",
                         attempts=4)
    response = admin_client.get(URL)
    assert response.status_code == 200
    text = response.content.decode()
    for shown in ("orders", "billing", "order-7", "RuntimeError: card declined"):
        assert shown in text
    assert "Traceback" not in text  # only the first line of the error
    assert listed(response) == [letter.offset]


def test_published_messages_are_not_dead_letters(admin_client):
    from django_sqlqueue import publish
    publish("orders", {"n": 2})
    letter = dead_letter()
    assert listed(admin_client.get(URL)) == [letter.offset]


def test_filter_by_topic_group_and_failed_date(admin_client):
    a = dead_letter(topic="orders", group="billing")
    b = dead_letter(topic="orders", group="shipping")
    c = dead_letter(topic="invoices", group="billing")
    assert listed(admin_client.get(URL, {"original_topic": "orders"})) == [a.offset, b.offset]
    assert listed(admin_client.get(URL, {"consumer_group": "billing"})) == [a.offset, c.offset]
    old = int((time.time() - 10 * 86400) * 1000)
    DeadLetter.objects.filter(offset=c.offset).update(failed_at=old)
    assert listed(admin_client.get(URL, {"failed": "24h"})) == [a.offset, b.offset]
    assert listed(admin_client.get(URL, {"failed": "older"})) == [c.offset]
    text = admin_client.get(URL).content.decode()
    assert "?original_topic=invoices" in text and "?consumer_group=shipping" in text


def test_search_by_declared_payload_field_finds_numbers_and_strings(admin_client):
    a = dead_letter(payload={"customer_id": 42, "total": 10})
    b = dead_letter(payload={"customer_id": "42"})
    dead_letter(payload={"customer_id": 43})
    dead_letter(payload=["not", "an", "object"])
    response = admin_client.get(URL, {"q": "customer_id=42"})
    assert listed(response) == [a.offset, b.offset]
    assert not response.context["sqlqueue_notes"]  # indexed: no "newest N only" note


def test_search_by_other_payload_field_says_it_searched_recent_dead_letters(admin_client):
    a = dead_letter(payload={"sku": "A-1", "customer_id": 1})
    dead_letter(payload={"sku": "B-2", "customer_id": 1})
    response = admin_client.get(URL, {"q": "sku=A-1 customer_id=1"})
    assert listed(response) == [a.offset]
    assert any("newest" in note for note in response.context["sqlqueue_notes"])
    assert "newest" in response.content.decode()


def test_search_by_offset_key_message_id_and_error_text(admin_client):
    a = dead_letter(key="order-7")
    b = dead_letter(error="TimeoutError: warehouse did not answer")
    c = dead_letter()
    assert listed(admin_client.get(URL, {"q": str(a.offset)})) == [a.offset]
    assert listed(admin_client.get(URL, {"q": "order-7"})) == [a.offset]
    assert listed(admin_client.get(URL, {"q": "warehouse did not"})) == [b.offset]
    assert listed(admin_client.get(URL, {"q": c.original_id})) == [c.offset]
    assert listed(admin_client.get(URL, {"q": "nothing-like-this"})) == []


def test_a_bad_payload_field_name_is_reported_not_an_error(admin_client):
    dead_letter()
    response = admin_client.get(URL, {"q": "cust'omer=1"})
    assert response.status_code == 200
    assert listed(response) == []
    assert "not a payload field name" in response.content.decode()


def test_the_detail_page_pretty_prints_payload_and_headers_and_shows_the_full_error(
        admin_client):
    letter = dead_letter(payload={"customer_id": 42, "lines": [1, 2]},
                         headers={"trace": "abc"}, error="RuntimeError: boom\n  line two")
    response = admin_client.get(
        reverse("admin:django_sqlqueue_deadletter_change", args=[letter.offset]))
    assert response.status_code == 200
    text = html.unescape(response.content.decode())
    assert '"customer_id": 42,\n  "lines": [\n    1,' in text
    assert '"trace": "abc"' in text
    assert "RuntimeError: boom\n  line two" in text


def test_payloads_keys_and_errors_are_escaped(admin_client):
    letter = dead_letter(payload={"note": "<script>alert(1)</script>"}, key="<b>k</b>",
                         error="<img src=x onerror=alert(2)>")
    listing = admin_client.get(URL).content.decode()
    detail = admin_client.get(
        reverse("admin:django_sqlqueue_deadletter_change", args=[letter.offset])).content.decode()
    for text in (listing, detail):
        assert "<img src=x" not in text and "<b>k</b>" not in text
    assert "<script>alert(1)</script>" not in detail
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail


def test_view_only_staff_can_look_but_has_no_actions_and_no_edit(db):
    letter = dead_letter()
    client = client_for(staff("viewer", "view_deadletter"))
    response = client.get(URL)
    assert response.status_code == 200
    assert listed(response) == [letter.offset]
    detail = client.get(reverse("admin:django_sqlqueue_deadletter_change", args=[letter.offset]))
    assert detail.status_code == 200
    assert 'name="_save"' not in detail.content.decode()
    assert client.get(reverse("admin:django_sqlqueue_deadletter_add")).status_code == 403


def test_staff_without_view_permission_cannot_look(db):
    dead_letter()
    assert client_for(staff("nobody")).get(URL).status_code == 403


def test_the_changelist_runs_a_fixed_number_of_queries_and_no_full_count(admin_client):
    for n in range(3):
        dead_letter(payload={"customer_id": n})
    admin_client.get(URL)  # sessions, content types: warm caches
    with CaptureQueriesContext(connection) as few:
        admin_client.get(URL)
    for n in range(30):
        dead_letter(payload={"customer_id": n}, group=f"g{n % 3}")
    with CaptureQueriesContext(connection) as many:
        response = admin_client.get(URL)
    assert len(listed(response)) == 33
    assert len(many.captured_queries) == len(few.captured_queries)
    counts = [q["sql"] for q in many.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT" in sql.upper() for sql in counts), counts


# --------------------------------------------------------------------------- actions


def post_action(client, action, selected=(), select_across=False, confirm=False, query=""):
    data = {"action": action, "index": "0", "select_across": "1" if select_across else "0",
            "_selected_action": [str(pk) for pk in selected]}
    if confirm:
        data["sqlqueue_confirm"] = "yes"
    return client.post(URL + query, data, follow=confirm)


def test_replaying_the_selection_asks_first_then_replays_only_those(admin_client):
    a, b, c = dead_letter(), dead_letter(), dead_letter()
    page = post_action(admin_client, "replay_dead_letters", [a.offset, b.offset])
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="sqlqueue-confirm-count"' in text and "<strong>2</strong>" in text
    assert DeadLetter.objects.count() == 3  # nothing happened yet
    done = post_action(admin_client, "replay_dead_letters", [a.offset, b.offset], confirm=True)
    assert "Replayed 2 dead letters" in done.content.decode()
    assert list(DeadLetter.objects.values_list("offset", flat=True)) == [c.offset]
    replays = QueueMessage.objects.filter(topic="orders", message_id__startswith="replay:")
    assert sorted(replays.values_list("message_id", flat=True)) == sorted(
        [f"replay:{a.offset}", f"replay:{b.offset}"])
    entry = LogEntry.objects.get()
    assert "Replayed 2" in entry.change_message and entry.user.username == "admin"


def test_replaying_everything_a_search_matches_counts_them_and_replays_only_those(admin_client):
    matching = [dead_letter(payload={"customer_id": 42, "n": n}) for n in range(3)]
    other = dead_letter(payload={"customer_id": 7})
    elsewhere = dead_letter(topic="invoices", payload={"customer_id": 42})
    query = "?" + urlencode({"q": "customer_id=42", "original_topic": "orders"})
    # As in a browser, "select all" also ticks the rows on the page (Django needs one).
    page = post_action(admin_client, "replay_dead_letters", [matching[0].offset],
                       select_across=True, query=query)
    text = page.content.decode()
    assert "<strong>3</strong>" in text and "everything the current filter matches" in text
    done = post_action(admin_client, "replay_dead_letters", [matching[0].offset],
                       select_across=True, confirm=True, query=query)
    assert "Replayed 3 dead letters" in done.content.decode()
    assert sorted(DeadLetter.objects.values_list("offset", flat=True)) == sorted(
        [other.offset, elsewhere.offset])
    assert QueueMessage.objects.filter(
        message_id__in=[f"replay:{m.offset}" for m in matching]).count() == 3


def test_discarding_deletes_the_dead_letters_for_good(admin_client):
    a, b = dead_letter(), dead_letter()
    done = post_action(admin_client, "discard_dead_letters", [a.offset], confirm=True)
    assert "Discarded 1 dead letter." in done.content.decode()
    assert list(DeadLetter.objects.values_list("offset", flat=True)) == [b.offset]
    assert not QueueMessage.objects.filter(message_id__startswith="replay:").exists()
    assert "Discarded 1" in LogEntry.objects.get().change_message


def test_each_action_needs_its_own_permission(db):
    letter = dead_letter()
    replayer = client_for(staff("replayer", "view_deadletter", "replay_deadletter"))
    page = replayer.get(URL).content.decode()
    assert "replay_dead_letters" in page and "discard_dead_letters" not in page
    post_action(replayer, "discard_dead_letters", [letter.offset], confirm=True)
    assert DeadLetter.objects.filter(offset=letter.offset).exists()
    viewer = client_for(staff("viewer", "view_deadletter"))
    assert "replay_dead_letters" not in viewer.get(URL).content.decode()
    post_action(viewer, "replay_dead_letters", [letter.offset], confirm=True)
    assert DeadLetter.objects.filter(offset=letter.offset).exists()
    assert not LogEntry.objects.exists()
    post_action(replayer, "replay_dead_letters", [letter.offset], confirm=True)
    assert not DeadLetter.objects.filter(offset=letter.offset).exists()


def test_a_bulk_replay_goes_through_every_batch(admin_client, monkeypatch):
    from django_sqlqueue.admin import dead_letters as module
    monkeypatch.setattr(module, "ACTION_BATCH", 2)
    letters = [dead_letter(payload={"customer_id": 5, "n": n}) for n in range(5)]
    DeadLetter.objects.filter(offset=letters[1].offset).update(failed_at=letters[3].failed_at)
    done = post_action(admin_client, "replay_dead_letters", [letters[0].offset],
                       select_across=True, confirm=True, query="?q=customer_id%3D5")
    assert "Replayed 5 dead letters" in done.content.decode()
    assert not DeadLetter.objects.exists()


def test_dead_letters_of_a_retired_group_are_skipped_and_said_so(admin_client):
    from django_sqlqueue.models import ConsumerOffset
    letter = dead_letter(group="retired")
    ConsumerOffset.objects.filter(consumer_group="retired").delete()
    done = post_action(admin_client, "replay_dead_letters", [letter.offset], confirm=True)
    assert "Skipped 1" in done.content.decode()
    assert DeadLetter.objects.filter(offset=letter.offset).exists()
    assert not LogEntry.objects.exists()
