"""Settings shared by every environment. Everything that differs between machines comes
from the environment (12-factor): DATABASE_URL, REDIS_URL, SECRET_KEY, ALLOWED_HOSTS, DEBUG."""
import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(os.environ.get("FABRICPOOL_VAR_DIR", BASE_DIR / "var"))


def env_bool(name, default=False):
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name, default=""):
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def env_float(name, default):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc


DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "django_celery_beat",
    "fabric",
    "pool",
    "scheduler",
    "drf_spectacular",
    "api",
    # Last: its post_migrate handler syncs the roles once every app's permissions exist.
    "core",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "core.security.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "core.middleware.RoleRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "core.context_processors.navigation",
            ],
        },
    },
]


def database_from_env():
    """DATABASE_URL, or a SQLite file under var/ in WAL mode with a busy timeout so that the
    web server, the Celery worker and beat can share it."""
    url = os.environ.get("DATABASE_URL")
    if url:
        config = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
    else:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        config = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(VAR_DIR / "fabricpool.sqlite3")}
    if config["ENGINE"].endswith("sqlite3"):
        config.setdefault("OPTIONS", {}).update(
            {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            }
        )
    return config


DATABASES = {"default": database_from_env()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# Django's cache (the login rate limit, core/security.py) is shared by every server process.
# Short timeouts: a Redis outage must not hang a login (the limit then goes unenforced).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "fabricpool",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    }
}

# --- security (core/security.py; production.py adds HTTPS) -----------------------------------
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CONTENT_TYPE_NOSNIFF = True
CONTENT_SECURITY_POLICY: dict = {}  # directive -> sources, over core.security.DEFAULT_CSP
CONTENT_SECURITY_POLICY_REPORT_ONLY = env_bool("CONTENT_SECURITY_POLICY_REPORT_ONLY", False)
# After this many failed logins for one user name from one address within the window,
# further attempts are refused without checking the password until the window ends.
LOGIN_FAILURE_LIMIT = int(env_float("LOGIN_FAILURE_LIMIT", 5))
LOGIN_FAILURE_WINDOW_S = int(env_float("LOGIN_FAILURE_WINDOW_S", 900))

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # CHANNEL_LAYER_PREFIX: a benchmark's server keeps its groups apart from earlier runs'.
        "CONFIG": {"hosts": [REDIS_URL], "capacity": 1000, "expiry": 30,
                   "prefix": os.environ.get("CHANNEL_LAYER_PREFIX", "asgi")},
    }
}

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A message taken by a worker that then died (SIGKILL, power) goes back to the queue after
# this many seconds (Redis transport); tasks are idempotent, so a second run is safe.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_float("CELERY_VISIBILITY_TIMEOUT", 3600.0)}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:overview"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

REST_FRAMEWORK = {
    # Bearer first: a request without a token header falls through to the session (with CSRF).
    "DEFAULT_AUTHENTICATION_CLASSES": ["api.authentication.BearerTokenAuthentication",
                                       "rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["api.permissions.RolePermission"],
    "DEFAULT_THROTTLE_CLASSES": ["api.throttling.WriteRateThrottle"],
    "DEFAULT_PAGINATION_CLASS": "api.pagination.Pagination",
    "DEFAULT_FILTER_BACKENDS": ["api.filters.SpecFilterBackend", "api.filters.StrictOrderingFilter"],
    "EXCEPTION_HANDLER": "api.errors.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "api.schema.AutoSchema",
}
# Writes (POST) through the API per user, e.g. "120/min" (reads are not limited).
API_WRITE_RATE = os.environ.get("API_WRITE_RATE", "120/min")
SPECTACULAR_SETTINGS = {
    "TITLE": "FabricPool API",
    "DESCRIPTION": "Jobs, placements, hosts, GPUs, pools, tenants, fabric and cycles of a FabricPool control plane.",
    "VERSION": "1",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["api.permissions.RolePermission"],
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "scheduler.models.Job.State", "PlacementStateEnum": "scheduler.models.Placement.State",
        "PlacementKindEnum": "scheduler.models.Placement.Kind", "HostStateEnum": "pool.models.Host.State",
        "LinkStateEnum": "fabric.models.Link.State", "LinkKindEnum": "fabric.models.Link.Kind",
        "FabricEventKindEnum": "fabric.models.FabricEvent.Kind",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

# --- fabric -------------------------------------------------------------------------------
# The discovery command runs on a host with an HCA; its output is imported as a diff.
IB_DISCOVER_COMMAND = os.environ.get("IB_DISCOVER_COMMAND", "ibnetdiscover")
IB_DISCOVER_TIMEOUT = env_float("IB_DISCOVER_TIMEOUT", 120.0)
IB_FABRIC_NAME = os.environ.get("IB_FABRIC_NAME", "default")
IB_PERFQUERY_COMMAND = os.environ.get("IB_PERFQUERY_COMMAND", "perfquery")
IB_LINKINFO_COMMAND = os.environ.get("IB_LINKINFO_COMMAND", "iblinkinfo")
IB_COUNTERS_TIMEOUT = env_float("IB_COUNTERS_TIMEOUT", 60.0)
# A link turns degraded when any error counter grows faster than this many per hour
# (rdma-core's ibqueryerrors thresholds are absolute counts; a rate survives counter resets).
IB_ERROR_RATE_PER_HOUR = env_float("IB_ERROR_RATE_PER_HOUR", 10.0)

# The ASGI app serves /static/ itself unless a web server in front does it.
SERVE_STATIC = env_bool("SERVE_STATIC", True)

# plotly.js is served from the installed plotly package (core/staticfinders.py), never a CDN.
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "core.staticfinders.PlotlyFinder",
]

# --- pool ---------------------------------------------------------------------------------
# Where a newly discovered host's agent answers; {host} is the host name.
AGENT_URL_TEMPLATE = os.environ.get("AGENT_URL_TEMPLATE", "http://{host}:9400")
POLL_INTERVAL = env_float("POLL_INTERVAL", 10.0)  # seconds between poll rounds
STALE_AFTER = int(env_float("STALE_AFTER", 3))  # missed rounds before a host is stale
UNREACHABLE_AFTER = int(env_float("UNREACHABLE_AFTER", 6))  # ... and unreachable
POLL_CONNECT_TIMEOUT = env_float("POLL_CONNECT_TIMEOUT", 1.0)
POLL_READ_TIMEOUT = env_float("POLL_READ_TIMEOUT", 3.0)
POLL_CHUNK_SIZE = int(env_float("POLL_CHUNK_SIZE", 512))  # agents per Celery task
POLL_CONCURRENCY = int(env_float("POLL_CONCURRENCY", 256))  # open connections per task
SAMPLE_RETENTION_HOURS = env_float("SAMPLE_RETENTION_HOURS", 24.0)


def _agent_token_secret():
    """One secret from which every host's agent token is derived (HMAC of the host name)."""
    return os.environ.get("AGENT_TOKEN_SECRET", "")


AGENT_TOKEN_SECRET = _agent_token_secret()  # empty: derived from SECRET_KEY in pool.tokens
# Two counter readings closer than this keep the older one as the baseline for rates.
IB_COUNTER_MIN_INTERVAL = env_float("IB_COUNTER_MIN_INTERVAL", 30.0)
# An unattended discovery that would lose more than this share of known switches is refused.
IB_DISCOVER_MAX_LOSS = env_float("IB_DISCOVER_MAX_LOSS", 0.5)
ROLLUP_1M_RETENTION_DAYS = env_float("ROLLUP_1M_RETENTION_DAYS", 7.0)
ROLLUP_1H_RETENTION_DAYS = env_float("ROLLUP_1H_RETENTION_DAYS", 90.0)
GPU_FP64_CLASSES: dict = {}  # model word -> "high" | "low", overrides pool's built-in table

# --- scheduler ----------------------------------------------------------------------------
CYCLE_INTERVAL = env_float("CYCLE_INTERVAL", 5.0)  # seconds between allocation cycles
PROPOSAL_TTL = env_float("PROPOSAL_TTL", 300.0)  # an undecided proposal expires after this
USAGE_HALF_LIFE_HOURS = env_float("USAGE_HALF_LIFE_HOURS", 24.0)  # fair-share usage decay
# Task classes (scheduler.engine.ClassRule; the admin's TaskClassRule rows override a class).
SCHEDULER_TASK_CLASSES = {
    "training": {"pack_tightly": True},
    "inference": {"prefer_healthy_leaves": True, "prefer_lightly_loaded": True, "preemptible": False},
    "simulation": {"prefer_healthy_leaves": True, "prefer_lightly_loaded": True, "preemptible": False},
    "science": {"requires_fp64": "high"},
    "rendering": {"leftovers_only": True},
}
# Order of the queue within one priority and fair-share level: "age" (oldest first) or
# "short_first" (fewest estimated GPU-seconds first; a job that has waited
# SCHEDULER_ORDER_MAX_WAIT_S goes ahead of those by age, so none starves). See README.
SCHEDULER_QUEUE_ORDER = os.environ.get("SCHEDULER_QUEUE_ORDER", "age")
SCHEDULER_ORDER_MAX_WAIT_S = env_float("SCHEDULER_ORDER_MAX_WAIT_S", 4 * 3600.0)
if SCHEDULER_QUEUE_ORDER not in ("age", "short_first"):
    raise ImproperlyConfigured(f"SCHEDULER_QUEUE_ORDER must be 'age' or 'short_first', not {SCHEDULER_QUEUE_ORDER!r}")
# Rebalancing: restartable jobs whose GPUs stayed under this utilization (%) this long are proposed for a move.
REBALANCE_IDLE_S = env_float("REBALANCE_IDLE_S", 3600.0)
REBALANCE_IDLE_UTILIZATION = env_float("REBALANCE_IDLE_UTILIZATION", 5.0)
# A submission asks for a cycle within this many seconds; more submissions meanwhile share it.
CYCLE_SOON_DELAY = env_float("CYCLE_SOON_DELAY", 1.0)
# Dispatch to agents: each request gives up after DISPATCH_TIMEOUT seconds; a host that did
# not answer is tried DISPATCH_RETRIES more times, DISPATCH_BACKOFF_S doubling (2+4+8+16 s).
DISPATCH_TIMEOUT = env_float("DISPATCH_TIMEOUT", 10.0)
DISPATCH_RETRIES = int(env_float("DISPATCH_RETRIES", 4))
DISPATCH_BACKOFF_S = env_float("DISPATCH_BACKOFF_S", 2.0)
# One cycle at a time: a Redis lock that expires by itself if a worker dies mid-cycle (the
# cycle task's hard time limit, 50 s, is below it).
CYCLE_LOCK_TTL = env_float("CYCLE_LOCK_TTL", 60.0)
# A placement approved this long ago and never sent (the broker was away when its approval
# committed), or dispatching this long with no dispatch activity (its worker died), is sent
# again by the allocation cycle task (dispatch is idempotent on the agents).
DISPATCH_STALE_S = env_float("DISPATCH_STALE_S", 60.0)
# A job whose dispatch failed waits this long before cycles consider it again.
DISPATCH_FAILED_BACKOFF_S = env_float("DISPATCH_FAILED_BACKOFF_S", 60.0)
# A GPU reported busy with work the scheduler does not know is offered to no job for this
# long after each such report (longer than POLL_INTERVAL, so it stays held between polls).
FOREIGN_BUSY_S = env_float("FOREIGN_BUSY_S", 60.0)

# --- live views ---------------------------------------------------------------------------
LIVE_FLUSH_INTERVAL_S = env_float("LIVE_FLUSH_INTERVAL_S", 0.25)  # a client gets at most one message per window
LIVE_KEY_PREFIX = os.environ.get("LIVE_KEY_PREFIX", "fabricpool:live:")

# --- Prometheus /metrics (core/views_metrics.py) --------------------------------------------
# A scraper needs the bearer token, an address in the allow-list, or both when both are set;
# with neither set only logged-in admins see /metrics. Histograms cover the last METRICS_WINDOW_S.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "").strip()
METRICS_ALLOWED_IPS = env_list("METRICS_ALLOWED_IPS")  # addresses or networks: 10.0.0.5,10.1.0.0/16
METRICS_WINDOW_S = env_float("METRICS_WINDOW_S", 900.0)
if METRICS_TOKEN and len(METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("METRICS_TOKEN must be at least 16 characters (e.g. `openssl rand -hex 32`)")
