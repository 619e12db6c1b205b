from django.db import models


class BenchJob(models.Model):
    """``bench_jobs``: the plain jobs table of the end-to-end baseline.

    Not used by the queue: the baseline claims rows with ``SELECT … FOR UPDATE SKIP LOCKED``
    and marks them done, the simplest database-backed work queue there is.
    """

    partition_key = models.CharField(max_length=255)
    payload = models.JSONField()
    claimed_by = models.CharField(max_length=64, null=True)  # noqa: DJ001 - NULL = unclaimed
    done = models.SmallIntegerField(default=0)

    class Meta:
        db_table = "bench_jobs"
        indexes = [models.Index(fields=["done", "id"], name="bench_jobs_done")]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.partition_key}, done={self.done})"
