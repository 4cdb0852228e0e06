"""Development and demo settings: the default of manage.py. SECRET_KEY comes from the
environment or is generated once into var/secret_key."""
import os
import secrets

from .base import *  # noqa: F401,F403
from .base import VAR_DIR


def _dev_secret_key():
    key = os.environ.get("SECRET_KEY")
    if key:
        return key
    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _dev_secret_key()
