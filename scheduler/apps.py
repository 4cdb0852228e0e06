from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler"
    verbose_name = "Scheduler"

    def ready(self):
        from . import receivers

        receivers.connect()  # dispatch after approvals, stops after cancels, reconciliation after polls
