"""ASGI entry point with the queue worker inside the web process (``make demo-embedded``):

    uvicorn --app-dir example_project example_project.asgi:application

The worker starts on the server's lifespan start-up and stops, finishing its in-flight
messages, on shutdown (SIGTERM, Ctrl-C). SQLQUEUE["EMBEDDED"] in settings.py says what it
runs; with SQLQUEUE_EMBEDDED=0 in the environment this serves requests only.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

from django_sqlqueue.embedded import sqlqueue_asgi  # noqa: E402 - after the settings module

application = sqlqueue_asgi(get_asgi_application())
