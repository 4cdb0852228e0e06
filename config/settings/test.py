"""Settings for the test suite: fast password hashing, real Redis and the database from
DATABASE_URL (SQLite under var/ when unset)."""
from .dev import *  # noqa: F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = False
# Tests never put messages on the real broker: a stray .delay() must not reach a demo worker.
# Tests that need a real worker start one with their own settings.
CELERY_BROKER_URL = "memory://"
