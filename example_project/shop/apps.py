from django.apps import AppConfig


class ShopConfig(AppConfig):
    """A tiny shop whose orders announce themselves on the ``orders`` topic."""

    name = "shop"
    default_auto_field = "django.db.models.BigAutoField"
