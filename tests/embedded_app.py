"""The web applications tests/test_embedded.py serves with real servers: the test project
with an embedded worker, configured by ``SQLQUEUE_TEST_SETTINGS`` ("EMBEDDED")."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402

from django_sqlqueue.embedded import sqlqueue_asgi, sqlqueue_wsgi  # noqa: E402

# uvicorn tests.embedded_app:asgi
asgi = sqlqueue_asgi(get_asgi_application())
# gunicorn -c tests/embedded_gunicorn.py tests.embedded_app:wsgi (the hooks run the worker)
wsgi = get_wsgi_application()
# gunicorn tests.embedded_app:wsgi_wrapped (no hooks: the first request starts the worker)
wsgi_wrapped = sqlqueue_wsgi(get_wsgi_application())
