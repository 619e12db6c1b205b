from django.apps import AppConfig


class ChaosConfig(AppConfig):
    name = "tests.chaos"
    label = "chaos"
    default = True

    def ready(self) -> None:
        from django_sqlqueue.signals import message_acked

        from .observe import record_ack

        message_acked.connect(record_ack, dispatch_uid="chaos-acks")
