"""Agent tokens are derived, per host, from one secret; the commands print and write them."""
import os
import stat

import pytest
from django.core.management import CommandError, call_command

from agent.protocol import derive_token
from pool.tokens import agent_secret, token_for


def test_tokens_come_from_the_configured_secret(settings):
    settings.AGENT_TOKEN_SECRET = "s3cret"
    assert agent_secret() == "s3cret"
    assert token_for("gpu0001") == derive_token("s3cret", "gpu0001")
    assert token_for("gpu0001") != token_for("gpu0002")


def test_without_a_secret_it_is_derived_from_secret_key(settings):
    settings.AGENT_TOKEN_SECRET = ""
    settings.SECRET_KEY = "key-one"
    first = agent_secret()
    assert first not in ("", "key-one") and len(first) == 64
    settings.SECRET_KEY = "key-two"
    assert agent_secret() != first


def test_agent_token_command_prints_the_hosts_token(settings, capsys):
    settings.AGENT_TOKEN_SECRET = "s3cret"
    call_command("agent_token", "gpu0007")
    assert capsys.readouterr().out.strip() == derive_token("s3cret", "gpu0007")


def test_agent_secret_command_writes_a_private_file(settings, tmp_path):
    settings.AGENT_TOKEN_SECRET = "s3cret"
    path = tmp_path / "secret"
    path.write_text("old")
    path.chmod(0o644)
    call_command("agent_secret", "--write", str(path), verbosity=0)
    assert path.read_text() == "s3cret\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_agent_secret_command_reports_an_unwritable_path(tmp_path):
    with pytest.raises(CommandError, match=r"--write .*/missing/secret: No such file or directory"):
        call_command("agent_secret", "--write", str(tmp_path / "missing" / "secret"))
