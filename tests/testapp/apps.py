from django.apps import AppConfig


class TestAppConfig(AppConfig):
    """Host app for the queues, consumers and models the test suite exercises."""

    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"
