"""Production settings: DJANGO_SETTINGS_MODULE=config.settings.production. SECRET_KEY and
ALLOWED_HOSTS must come from the environment; `manage.py check --deploy` passes clean."""
import os

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F401,F403
from .base import env_bool, env_float

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set in the environment for production")
if not os.environ.get("ALLOWED_HOSTS"):
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set in the environment for production")

DEBUG = False
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
# Deployed behind a TLS-terminating proxy that sets X-Forwarded-Proto (and overwrites what
# clients send). Serving HTTPS directly, or behind a proxy that passes the header on, set
# SECURE_PROXY_SSL_HEADER=none: otherwise a client could claim https. Another header name
# (e.g. HTTP_X_FORWARDED_SCHEME) replaces it.
_proxy_header = os.environ.get("SECURE_PROXY_SSL_HEADER", "HTTP_X_FORWARDED_PROTO").strip()
SECURE_PROXY_SSL_HEADER = None if _proxy_header.lower() in {"", "none", "off"} else (_proxy_header, "https")
# HSTS is sent on HTTPS responses only (SecurityMiddleware); 0 turns it off.
SECURE_HSTS_SECONDS = int(env_float("SECURE_HSTS_SECONDS", 31536000))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
