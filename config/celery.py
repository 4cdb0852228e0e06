"""The Celery app. Periodic jobs live in django-celery-beat's tables, so operators change
their intervals in Django admin; the data migrations of each app create them."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

app = Celery("fabricpool")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
