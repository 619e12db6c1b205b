"""The queue in Django's admin: dead letters, the log, partitions, subscribers, overview,
schedules.

Imported by ``django.contrib.admin``'s autodiscovery; nothing to register by hand.
"""

from . import dead_letters, messages, overview, pages, schedules  # noqa: F401  (register their ModelAdmins)
from .schema_guard import guard_admin_pages

guard_admin_pages()  # before migrate: one line naming manage.py migrate, not a 500
