"""Fixtures of the live-update tests: the real Redis channel layer and Redis keys under a
prefix of their own (a test run next to a demo, or another run, shares nothing with them),
and session cookies of users as a browser would send them."""
import uuid

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.test import Client

from config.asgi import application

ORIGIN = (b"origin", b"http://localhost")


@pytest.fixture
def live_settings(settings):
    tag = uuid.uuid4().hex[:10]
    redis_url = settings.REDIS_URL  # a test may point the settings at a dead Redis
    settings.LIVE_KEY_PREFIX = f"test-live-{tag}:"
    settings.LIVE_FLUSH_INTERVAL_S = 0.25
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [settings.REDIS_URL], "prefix": f"test{tag}",
                                                      "capacity": 1000, "expiry": 30}}}
    yield settings
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"test-live-{tag}:*"))
    if keys:
        client.delete(*keys)


def session_cookie(username="vera", role="viewer"):
    user = User.objects.create_user(username, password="unused-password-1")
    if role:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


def connect(path, headers):
    """A communicator on the project's ASGI app (call from async code)."""
    return WebsocketCommunicator(application, path, headers=headers)


def run(coro_fn):
    return async_to_sync(coro_fn)()
