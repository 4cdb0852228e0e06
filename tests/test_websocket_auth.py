"""Every websocket is authenticated and origin-checked before a consumer sees it: tested
against the project's real ASGI application (config.asgi), as a browser connects."""
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings

from config.asgi import application
from core.consumers import CLOSE_NO_ROLE, CLOSE_UNAUTHENTICATED

# Transactional: the auth middleware reads the session from another thread.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("memory_channel_layer"),
]
ORIGIN = (b"origin", b"http://localhost")


@pytest.fixture
def memory_channel_layer():
    with override_settings(CHANNEL_LAYERS={"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}):
        yield


def session_cookie(username="vera", role="viewer"):
    user = User.objects.create_user(username, password="unused-password-1")
    if role:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


def exchange(headers, send=None):
    """Connect, read the first message, optionally send one and read the answer."""

    async def run():
        communicator = WebsocketCommunicator(application, "/ws/heartbeat/", headers=headers)
        connected, code = await communicator.connect(timeout=5)
        replies = []
        if connected:
            replies.append(await communicator.receive_json_from(timeout=5))
            if send is not None:
                await communicator.send_json_to(send)
                replies.append(await communicator.receive_json_from(timeout=5))
            await communicator.disconnect()
        return connected, code, replies

    return async_to_sync(run)()


def test_anonymous_socket_is_refused():
    connected, code, replies = exchange([ORIGIN])
    assert not connected and code == CLOSE_UNAUTHENTICATED and replies == []


def test_forged_session_cookie_is_refused():
    connected, code, _ = exchange([ORIGIN, (b"cookie", b"sessionid=not-a-real-session")])
    assert not connected and code == CLOSE_UNAUTHENTICATED


def test_logged_in_account_without_a_role_is_refused():
    connected, code, _ = exchange([ORIGIN, session_cookie("nobody", role=None)])
    assert not connected and code == CLOSE_NO_ROLE


def test_logged_in_user_connects_and_gets_hello_then_pong():
    connected, _, replies = exchange([ORIGIN, session_cookie("vera")], send={"type": "ping"})
    assert connected
    assert replies == [{"type": "hello", "user": "vera"}, {"type": "pong"}]


@pytest.mark.parametrize("origin", [b"http://evil.example", b"http://localhost.evil.example", b"null"])
def test_foreign_origin_is_refused_even_with_a_valid_session(origin):
    connected, code, replies = exchange([(b"origin", origin), session_cookie()])
    assert not connected and replies == []
    assert code != CLOSE_UNAUTHENTICATED  # refused at the origin check, before auth


def test_missing_origin_is_refused():
    connected, _, _ = exchange([session_cookie()])
    assert not connected


def test_session_ended_by_logout_is_refused():
    cookie = session_cookie("vera")
    from django.contrib.sessions.models import Session

    Session.objects.all().delete()  # what logout does to the session row
    connected, code, _ = exchange([ORIGIN, cookie])
    assert not connected and code == CLOSE_UNAUTHENTICATED


# --- every route of config/routing.py, found by itself -------------------------------------------

def routes() -> list[str]:
    """One concrete path per websocket route; parameters name an existing host ("gpu0001")."""
    import re

    from config.routing import websocket_urlpatterns

    return ["/" + re.sub(r"<(?:\w+:)?\w+>", "gpu0001", str(p.pattern).lstrip("^").rstrip("$")) for p in websocket_urlpatterns]


@pytest.fixture
def host():
    from pool.models import Host

    return Host.objects.create(name="gpu0001")


def connect(path, headers):
    async def run():
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await communicator.connect(timeout=10)
        first = await communicator.receive_json_from(timeout=10) if connected else None
        if connected:
            await communicator.disconnect()
        return connected, code, first

    return async_to_sync(run)()


def test_the_route_list_is_the_projects():
    assert "/ws/heartbeat/" in routes() and "/ws/live/host/gpu0001/" in routes() and len(routes()) >= 5


@pytest.mark.parametrize("path", routes())
def test_every_route_refuses_foreign_origins_anonymous_and_roleless_users(path, host):
    cookie = session_cookie("vera")
    for origin in (b"http://evil.example", b"null"):
        connected, code, _ = connect(path, [(b"origin", origin), cookie])
        assert not connected and code != CLOSE_UNAUTHENTICATED, f"{path} accepted Origin {origin!r}"
    assert not connect(path, [cookie])[0], f"{path} accepted a socket without Origin"
    connected, code, _ = connect(path, [ORIGIN])
    assert not connected and code == CLOSE_UNAUTHENTICATED, f"{path} accepted an anonymous socket"
    connected, code, _ = connect(path, [ORIGIN, session_cookie("nobody", role=None)])
    assert not connected and code == CLOSE_NO_ROLE, f"{path} accepted an account without a role"
    # The same socket from the site's own page connects: the refusals above are the checks'.
    connected, _, first = connect(path, [ORIGIN, cookie])
    assert connected and first["type"] in {"hello", "snapshot"}, first
