"""Login rate limit (core/security.py): after LOGIN_FAILURE_LIMIT failed logins for one user
name from one address, that pair is refused with a clear message, even with the right
password, until the window ends. Counted in the real Redis cache (REDIS_URL)."""
import time

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings

from core.security import clear_failures, failures

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"
REFUSED = "Too many failed logins for this user from your address"
NAMES = ["otto", "vera", "ada", "Otto"]
ADDRESSES = ["127.0.0.1", "10.0.0.9"]


@pytest.fixture(autouse=True)
def fresh_counters():
    def clear():
        for name in NAMES:
            for address in ADDRESSES:
                clear_failures(name, address)

    clear()
    yield
    clear()


def make_user(username, role="operator", **extra):
    user = User.objects.create_user(username, password=PASSWORD, **extra)
    user.groups.add(Group.objects.get(name=role))
    return user


def attempt(client, username, password, path="/login/", **extra):
    response = client.post(path, {"username": username, "password": password}, **extra)
    return response, response.content.decode()


@override_settings(LOGIN_FAILURE_LIMIT=3, LOGIN_FAILURE_WINDOW_S=900)
def test_after_the_limit_even_the_right_password_is_refused_with_a_clear_message(client):
    make_user("otto")
    for _ in range(3):
        response, text = attempt(client, "otto", "wrong guess")
        assert response.status_code == 200 and "Please enter a correct username and password" in text
    response, text = attempt(client, "otto", PASSWORD)
    assert response.status_code == 200
    assert f"{REFUSED}. Try again in 15 minute(s)." in text
    assert client.get("/").status_code == 302  # not logged in
    assert failures("otto", "127.0.0.1")[0] == 3  # refused attempts check no password and count nothing more
    # The user name's case does not give more guesses.
    assert REFUSED in attempt(client, "OTTO", PASSWORD)[1]


@override_settings(LOGIN_FAILURE_LIMIT=2)
def test_the_limit_is_per_user_name_and_address(client):
    make_user("otto")
    make_user("vera", "viewer")
    for _ in range(2):
        attempt(client, "otto", "wrong guess")
    assert REFUSED in attempt(client, "otto", PASSWORD)[1]
    # Another user from the same address, and the same user from another address, log in.
    response, _ = attempt(Client(), "vera", PASSWORD)
    assert response.status_code == 302
    response, _ = attempt(Client(), "otto", PASSWORD, REMOTE_ADDR="10.0.0.9")
    assert response.status_code == 302


@override_settings(LOGIN_FAILURE_LIMIT=3)
def test_a_successful_login_clears_the_count(client):
    make_user("otto")
    for _ in range(2):
        attempt(client, "otto", "wrong guess")
    assert attempt(client, "otto", PASSWORD)[0].status_code == 302
    assert failures("otto", "127.0.0.1")[0] == 0
    client.post("/logout/")
    for _ in range(2):
        attempt(client, "otto", "wrong guess")
    assert attempt(client, "otto", PASSWORD)[0].status_code == 302


@override_settings(LOGIN_FAILURE_LIMIT=2)
def test_the_admin_login_page_is_limited_too(client):
    make_user("ada", "admin", is_staff=True)
    for _ in range(2):
        attempt(client, "ada", "wrong guess", path="/admin/login/")
    response, text = attempt(client, "ada", PASSWORD, path="/admin/login/")
    assert response.status_code == 200 and REFUSED in text
    # The count is shared with the dashboard's login page.
    assert REFUSED in attempt(client, "ada", PASSWORD)[1]


@override_settings(LOGIN_FAILURE_LIMIT=1, LOGIN_FAILURE_WINDOW_S=1)
def test_the_window_ends_and_logins_work_again(client):
    make_user("otto")
    attempt(client, "otto", "wrong guess")
    assert REFUSED in attempt(client, "otto", PASSWORD)[1]
    time.sleep(2.1)  # the Redis keys expire with the window
    assert attempt(client, "otto", PASSWORD)[0].status_code == 302


def test_parallel_guesses_are_all_counted():
    """add+incr is atomic in Redis: guesses sent at once cannot share one count."""
    from concurrent.futures import ThreadPoolExecutor

    from core.security import record_failure

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: record_failure("vera", "10.0.0.9"), range(40)))
    assert failures("vera", "10.0.0.9")[0] == 40


@override_settings(CACHES={"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                       "LOCATION": "redis://127.0.0.1:1/0",
                                       "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1}}},
                   LOGIN_FAILURE_LIMIT=1)
def test_with_the_cache_down_logins_still_work(client, caplog):
    """A Redis outage must not lock operators out; the limit is then not enforced (logged)."""
    make_user("otto")
    assert attempt(client, "otto", "wrong guess")[0].status_code == 200
    assert attempt(client, "otto", PASSWORD)[0].status_code == 302
    assert "login rate limit not enforced: the cache is unavailable" in caplog.text
