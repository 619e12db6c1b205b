"""Rows and users for the admin tests: dead letters made the way a worker makes them."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import Permission, User
from django.test import Client

from django_sqlqueue import publish
from django_sqlqueue.models import ConsumerOffset, DeadLetter, QueueMessage, Topic
from django_sqlqueue.models.messages import DeadLetterSource


def dead_letter(topic: str = "orders", group: str = "billing", payload: Any = None,
                key: str = "", error: str = "RuntimeError: boom", attempts: int = 5,
                headers: dict[str, str] | None = None) -> DeadLetter:
    """Publish a message and give up on it for ``group``, as a worker does."""
    stored = publish(topic, {"n": 1} if payload is None else payload, key=key, headers=headers)
    QueueMessage.objects.copy_to_dead_letters(
        DeadLetterSource(stored.offset, topic, key, stored.id, json.dumps(stored.payload),
                         json.dumps(stored.headers), 0),
        f"{topic}_dlq", group, attempts, error, using="default")
    Topic.objects.record({topic: 4, f"{topic}_dlq": 4}, using="default")
    ConsumerOffset.objects.ensure(group, topic, ["0"], using="default")
    return DeadLetter.objects.get(original_offset=stored.offset, consumer_group=group)


def staff(username: str, *codenames: str) -> User:
    """A staff user holding the named permissions of the django_sqlqueue app."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    if codenames:
        user.user_permissions.set(Permission.objects.filter(
            content_type__app_label="django_sqlqueue", codename__in=codenames))
    return user


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client
