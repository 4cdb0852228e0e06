"""Settings come from the environment: production passes Django's deployment checks and
refuses to start half-configured; DATABASE_URL picks the database."""
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from config.settings import base

ROOT = Path(__file__).resolve().parent.parent


def manage(*args, env):
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def production_env(**overrides):
    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS"}}
    env |= {
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "SECRET_KEY": secrets.token_urlsafe(50),  # 67 characters
        "ALLOWED_HOSTS": "fabricpool.example.org",
    }
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def test_production_settings_pass_the_deployment_checks_without_warnings():
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=production_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout
    assert "WARNING" not in result.stdout + result.stderr
    assert "security." not in result.stdout + result.stderr  # no security.W0xx ids


@pytest.mark.parametrize("missing", ["SECRET_KEY", "ALLOWED_HOSTS"])
def test_production_refuses_to_start_without_required_setting(missing):
    for empty in (None, ""):
        result = manage("check", env=production_env(**{missing: empty}))
        assert result.returncode != 0
        # One clear line, no traceback.
        assert result.stderr.strip() == f"configuration error: {missing} must be set in the environment for production"


def test_database_url_selects_postgresql(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://fp:secret@db.example.org:5433/fabricpool")
    config = base.database_from_env()
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["NAME"], config["USER"], config["PASSWORD"]) == ("fabricpool", "fp", "secret")
    assert (config["HOST"], config["PORT"]) == ("db.example.org", 5433)
    assert config["CONN_MAX_AGE"] == 60 and config["CONN_HEALTH_CHECKS"] is True
    assert "init_command" not in config.get("OPTIONS", {})  # SQLite pragmas only go to SQLite


def test_no_database_url_means_sqlite_in_wal_mode_under_var(monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setattr(base, "VAR_DIR", tmp_path / "var")
    config = base.database_from_env()
    assert config["ENGINE"] == "django.db.backends.sqlite3"
    assert config["NAME"] == str(tmp_path / "var" / "fabricpool.sqlite3")
    assert (tmp_path / "var").is_dir()
    assert "PRAGMA journal_mode=WAL" in config["OPTIONS"]["init_command"]
    assert config["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert config["OPTIONS"]["timeout"] == 20


def test_sqlite_database_url_gets_the_same_wal_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/other.sqlite3")
    config = base.database_from_env()
    assert config["NAME"] == f"{tmp_path}/other.sqlite3"
    assert "PRAGMA journal_mode=WAL" in config["OPTIONS"]["init_command"]
    assert config["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


def test_default_sqlite_database_really_runs_in_wal_mode(tmp_path):
    """What the web server, worker and beat share by default: a file in WAL mode."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE"}}
    env["FABRICPOOL_VAR_DIR"] = str(tmp_path)
    code = "from django.db import connection; c = connection.cursor(); c.execute('PRAGMA journal_mode'); print(c.fetchone()[0])"
    result = manage("shell", "--no-imports", "-c", code, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "wal"
    assert (tmp_path / "fabricpool.sqlite3").exists()
