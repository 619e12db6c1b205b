from django.apps import AppConfig


class ChaosConfig(AppConfig):
    name = "tests.chaos"
    label = "chaos"
    default = True
