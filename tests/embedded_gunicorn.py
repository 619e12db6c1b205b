"""gunicorn's configuration in tests/test_embedded.py: the embedded worker's hooks."""

from django_sqlqueue.embedded.gunicorn import post_fork, worker_exit  # noqa: F401

graceful_timeout = 20  # seconds; longer than the test settings' SHUTDOWN_GRACE (10)
loglevel = "warning"
