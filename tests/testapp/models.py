from django.db import models


class Handled(models.Model):
    """One handler run, recorded by the test handlers in queues.py."""

    group = models.CharField(max_length=100)
    topic = models.CharField(max_length=255)
    key = models.CharField(max_length=255)
    offset = models.BigIntegerField()
    message_id = models.CharField(max_length=128)
    payload = models.JSONField(null=True)
    attempt = models.IntegerField()
    pid = models.IntegerField()
    handled_at = models.FloatField()  # time.time() when the handler started

    class Meta:
        db_table = "testapp_handled"

    def __str__(self) -> str:
        return f"{self.group} ran {self.topic}/{self.key}@{self.offset} (attempt {self.attempt})"
