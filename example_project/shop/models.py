from __future__ import annotations

from django.db import models


class Order(models.Model):
    """A customer's order; placing one publishes an ``orders`` message in the same transaction."""

    class Status(models.TextChoices):
        PLACED = "placed"
        PAID = "paid"
        SHIPPED = "shipped"
        CANCELLED = "cancelled"

    customer = models.CharField(max_length=100)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PLACED)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"order #{self.pk} for {self.customer} ({self.total})"


class HandlerRun(models.Model):
    """One run of a queue handler, kept so the demo can show who handled what."""

    group = models.CharField(max_length=100)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="handler_runs")
    message_offset = models.BigIntegerField()
    attempt = models.IntegerField()
    worker_pid = models.IntegerField()
    succeeded = models.BooleanField()
    handled_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.group} handled order #{self.order_id} (attempt {self.attempt})"
