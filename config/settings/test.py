"""Settings for the test suite: fast password hashing, real Redis and the database from
DATABASE_URL (SQLite under var/ when unset)."""
from .dev import *  # noqa: F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = False
