"""Agent tokens. The server stores no per-host token: each host's bearer token is an HMAC
of its name under one cluster secret (agent.protocol.derive_token), so a leaked database
row reveals nothing and provisioning a host needs only `manage.py agent_token HOST`."""
import hashlib

from django.conf import settings

from agent.protocol import derive_token


def agent_secret() -> str:
    """settings.AGENT_TOKEN_SECRET, or one derived from SECRET_KEY when that is empty (so a
    fresh install works without another secret to manage; set it to rotate tokens on its own)."""
    configured = getattr(settings, "AGENT_TOKEN_SECRET", "")
    if configured:
        return configured
    return hashlib.sha256(("fabricpool-agent-secret:" + settings.SECRET_KEY).encode()).hexdigest()


def token_for(host_name: str) -> str:
    return derive_token(agent_secret(), host_name)
