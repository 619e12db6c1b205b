"""URLs of django-sqlqueue: ``path("sqlqueue/", include("django_sqlqueue.urls"))`` serves
the Prometheus gauges at ``/sqlqueue/metrics``."""

from django.urls import path

from . import views

app_name = "django_sqlqueue"

urlpatterns = [
    path("metrics", views.metrics, name="metrics"),
]
