"""Agent tokens: derived by HMAC from one secret (never stored), compared in constant time
on equal-length digests by the agent and the simulator, and a near miss is a 401."""
import asyncio
import hashlib
import hmac

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent import protocol
from agent.report import Collector
from agent.server import AgentConfig, make_app
from pool.tokens import token_for

TOKEN = token_for("gpu001")


def test_token_comparison_is_constant_time_on_equal_length_digests(monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert protocol.token_matches(TOKEN, TOKEN)
    for near in (TOKEN[:-1], TOKEN + "0", TOKEN.upper(), "x", TOKEN[:32]):
        assert not protocol.token_matches(near, TOKEN)
    assert not protocol.token_matches("", TOKEN) and not protocol.token_matches(None, TOKEN)
    # Every non-empty candidate went through compare_digest, on SHA-256 digests: neither the
    # content nor the length of the expected token shows in the time taken.
    assert len(calls) == 6
    assert all(len(a) == len(b) == hashlib.sha256().digest_size for a, b in calls)


def test_tokens_are_an_hmac_of_the_host_name(settings):
    settings.AGENT_TOKEN_SECRET = "cluster-secret"
    expected = hmac.new(b"cluster-secret", b"fabricpool-agent:gpu001", hashlib.sha256).hexdigest()
    assert token_for("gpu001") == expected and token_for("gpu002") != expected


@pytest.mark.django_db
def test_no_agent_token_is_stored_in_the_database(settings):
    """The server derives each host's token when it polls: no row holds one."""
    from django.apps import apps
    from django.db import models

    from pool.models import Host

    settings.AGENT_TOKEN_SECRET = "cluster-secret"
    names = [f"gpu{n:03d}" for n in range(1, 5)]
    Host.objects.bulk_create([Host(name=name) for name in names])
    tokens = {token_for(name) for name in names}
    found = []
    for model in apps.get_models():
        text_fields = [f.attname for f in model._meta.concrete_fields if isinstance(f, (models.CharField, models.TextField))]
        for row in model._base_manager.values_list(*text_fields) if text_fields else []:
            found += [f"{model._meta.label}: {value}" for value in row if value in tokens]
    assert not found


@pytest.mark.parametrize("header", [
    "", "Bearer", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}0", f"Basic {TOKEN}", f"Bearer {TOKEN.upper()}",
    f"Bearer {token_for('gpu002')}",  # another host's token
])
def test_the_agent_refuses_a_wrong_token_before_any_handler(header, tmp_path):
    collector = Collector("gpu001", sysfs_root=tmp_path, read_gpus=lambda: [])
    config = AgentConfig(host_name="gpu001", token=TOKEN, log_dir=tmp_path / "logs", grace_s=0.1, collector=collector)

    async def main():
        async with TestClient(TestServer(make_app(config))) as client:
            refused = await client.get("/v1/report", headers={"Authorization": header} if header else {})
            body = await refused.json()
            start = await client.post("/v1/allocations", headers={"Authorization": header} if header else {}, data=b"{}")
            accepted = await client.get("/v1/report", headers={"Authorization": f"Bearer {TOKEN}"})
            return refused.status, body, refused.headers.get("WWW-Authenticate"), start.status, accepted.status

    status, body, challenge, start, accepted = asyncio.run(main())
    assert status == 401 and "missing or wrong bearer token" in str(body)
    assert challenge == 'Bearer realm="fabricpool-agent"'
    assert start == 401  # nothing started
    assert accepted == 200
