"""Django settings, read from environment variables only (see .env.example)."""

from __future__ import annotations

from pathlib import Path

from django.utils.csp import CSP

from portal.lib.env import (
    ConfigError,
    development_fernet_key,
    env_bool,
    env_fernet_keys,
    env_int,
    env_list,
    env_str,
    parse_database_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", "insecure-development-key-change-me" if DEBUG else None)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# Keys that encrypt job secret variables, admins' TOTP secrets and webhooks at rest (portal.lib.encryption):
# comma-separated Fernet keys, the first encrypts, all decrypt. Required unless DEBUG, which
# derives a throw-away one from SECRET_KEY.
FIELD_ENCRYPTION_KEYS = env_fernet_keys(
    "FIELD_ENCRYPTION_KEYS", development_fernet_key(SECRET_KEY) if DEBUG else None
)

INSTALLED_APPS = [
    "portal.accounts.apps.PortalAdminConfig",  # django.contrib.admin behind a second factor
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",  # ArrayField (a job's `after`)
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "portal.accounts",
    "portal.cluster",
    "portal.jobs",
    "portal.agentgw",
    "portal.live",
    "portal.shell",
    "portal.metrics",
    "portal.web",
]

MIDDLEWARE = [
    "portal.lib.logging.RequestIdMiddleware",
    # /healthz and /metrics for the container health check and Prometheus (127.0.0.1, web:8000),
    # before host validation and the TLS redirect: see portal/lib/probes.py.
    "portal.lib.probes.ProbesMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "portal.lib.middleware.ErrorResponsesMiddleware",
]

ROOT_URLCONF = "portal.urls"
ASGI_APPLICATION = "portal.asgi.application"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "portal" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": parse_database_url(env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:55432/gpuportal"))
}
# Under ASGI each request runs in a thread of its own, so a persistent connection is opened per
# request and lingers until the garbage collector finds it (a hundred idle connections after a
# few hundred requests). The ASGI entry point (asgi.py) therefore sets DATABASE_POOL_SIZE to 16
# unless it is set: a pool of at most that many connections per process.
if (DATABASE_POOL_SIZE := env_int("DATABASE_POOL_SIZE", 0)) > 0:
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps the connections
    DATABASES["default"]["OPTIONS"] = {"pool": {"min_size": 2, "max_size": DATABASE_POOL_SIZE, "timeout": 10}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:56379/0")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
# The built single-page app: index.html is served by portal.web, its assets as static files.
FRONTEND_DIST = BASE_DIR / "frontend" / "dist"
STATICFILES_DIRS = [FRONTEND_DIST] if FRONTEND_DIST.exists() else []
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG

LOGIN_URL = "/admin/login/"

# Security: secure defaults outside DEBUG, so `manage.py check --deploy` is clean in production.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
# Internal plain-HTTP callers (ProbesMiddleware answers them first; kept should it move).
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_HTTPONLY = True
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_TLS_PROXY", False) else None
X_FRAME_OPTIONS = "DENY"
# Scripts, styles and connections only from this site (the web app, admin and API docs are all
# served from here); websockets to this host. The API docs page needs inline script and style.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.UNSAFE_INLINE],
    "style-src": [CSP.SELF, CSP.UNSAFE_INLINE],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF, "ws:", "wss:"],
    "font-src": [CSP.SELF, "data:"],
    "frame-ancestors": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "form-action": [CSP.SELF],
}
SECURE_REFERRER_POLICY = "same-origin"

# Throttles count anonymous callers by address. 0: the address of the connection (REMOTE_ADDR),
# so a client cannot pick a fresh one per request by sending its own X-Forwarded-For; N (behind N
# trusted proxies that each append to X-Forwarded-For): the address the outermost one saw.
NUM_PROXIES = env_int("NUM_PROXIES", 0)
if NUM_PROXIES < 0:
    raise ConfigError(f"NUM_PROXIES must be 0 or more, not {NUM_PROXIES}")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.accounts.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "portal.lib.pagination.LimitOffsetPages",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Refused writes (403, 404) are audited and counted towards security alerts.
    "EXCEPTION_HANDLER": "portal.accounts.security.api_exception_handler",
    # Sign-in (API and admin), the admin's second factor, token creation, submission and dry
    # runs of it (each a whole scheduling cycle's work) are throttled per user (per address
    # when anonymous).
    "NUM_PROXIES": NUM_PROXIES,
    "DEFAULT_THROTTLE_RATES": {
        "sign-in": env_str("THROTTLE_SIGN_IN", "10/min"),
        "admin-mfa": env_str("THROTTLE_ADMIN_MFA", "5/min"),
        "tokens": env_str("THROTTLE_TOKENS", "30/min"),
        "submit": env_str("THROTTLE_SUBMIT", "600/min"),
        "dry-run": env_str("THROTTLE_DRY_RUN", "30/min"),
        # Webhook changes and test deliveries (each a request to another server).
        "webhooks": env_str("THROTTLE_WEBHOOKS", "30/min"),
        # Saving, changing and deleting job templates (each checks a whole job spec).
        "templates": env_str("THROTTLE_TEMPLATES", "60/min"),
        # Tenant admins adding members, changing their roles and removing them.
        "members": env_str("THROTTLE_MEMBERS", "30/min"),
    },
    "DEFAULT_PARSER_CLASSES": [
        "portal.lib.parsers.JSONParser",
        "portal.lib.parsers.YAMLParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
}

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Portal API",
    "DESCRIPTION": "Submit and watch GPU jobs, see virtual clusters, quotas and nodes.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "portal.jobs.choices.JobState",
        "AttemptStateEnum": "portal.jobs.choices.AttemptState",
        "DependencyTypeEnum": "portal.jobs.choices.DependencyType",
        "NodeStateEnum": "portal.cluster.choices.NodeState",
        "WebhookFormatEnum": "portal.accounts.choices.WebhookFormat",
    },
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # The layer waits on blocking pops; redis-py 8 would otherwise cut every idle read after
        # its 5 s default socket timeout and tear down every websocket with it.
        # Each group_add or group_discard borrows a connection; when a thousand agents or browsers
        # connect or leave at once, redis-py's default of 100 would refuse most of them.
        "CONFIG": {
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": None,
                    "max_connections": env_int("CHANNEL_LAYER_MAX_CONNECTIONS", 2000),
                }
            ]
        },
    },
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ALWAYS_EAGER = False

CELERY_BEAT_SCHEDULE = {
    "check-node-heartbeats": {"task": "portal.cluster.tasks.check_node_heartbeats", "schedule": 10.0},
    # The safety net: changes request cycles themselves, this catches anything they missed. It
    # never waits for a cycle in progress, and one a busy worker did not take within a period is
    # dropped (the next one comes then), so slow cycles do not pile these up.
    "schedule-cycle": {
        "task": "scheduler.tasks.schedule_cycle",
        "schedule": 5.0,
        "kwargs": {"from_beat": True},
        "options": {"expires": 5.0},
    },
    "check-time-limits": {"task": "portal.jobs.tasks.check_time_limits", "schedule": 5.0},
    "check-idle-jobs": {"task": "portal.jobs.tasks.check_idle_jobs", "schedule": 60.0},
    "check-budgets": {"task": "portal.cluster.tasks.check_budgets", "schedule": 60.0},
    "compact-telemetry": {"task": "portal.jobs.tasks.compact_telemetry", "schedule": 600.0},
    "expire-logs": {"task": "portal.jobs.tasks.expire_logs", "schedule": 600.0},
    "collect-checkpoints": {
        "task": "portal.jobs.tasks.collect_checkpoints",
        "schedule": float(env_int("CHECKPOINT_GC_INTERVAL_S", 300)),
    },
}

# Domain settings.
API_TOKEN_DEFAULT_DAYS = env_int("API_TOKEN_DEFAULT_DAYS", 90)
NODE_SILENT_AFTER_S = env_int("NODE_SILENT_AFTER_S", 30)
NODE_LOST_AFTER_S = env_int("NODE_LOST_AFTER_S", 50)
TIME_LIMIT_WARNING_S = env_int("TIME_LIMIT_WARNING_S", 300)
TIME_LIMIT_FORCE_AFTER_S = env_int("TIME_LIMIT_FORCE_AFTER_S", 120)
IDLE_BELOW_PCT = env_int("IDLE_BELOW_PCT", 5)
IDLE_AFTER_S = env_int("IDLE_AFTER_S", 1800)
TELEMETRY_RETENTION_DAYS = env_int("TELEMETRY_RETENTION_DAYS", 30)
# Job output: an attempt keeps at most this many bytes (0: no cap); a job's output is deleted this
# many days after the job ended (0: kept forever).
LOG_MAX_BYTES_PER_ATTEMPT = env_int("LOG_MAX_BYTES_PER_ATTEMPT", 100 * 1024 * 1024)
LOG_RETENTION_DAYS = env_int("LOG_RETENTION_DAYS", 90)
# Mail to job owners (a spec's `notify`) and about idle jobs, through an SMTP server: off while
# SMTP_HOST is empty.
SMTP_HOST = env_str("SMTP_HOST", "")
MAIL_ENABLED = bool(SMTP_HOST)
MAILERS = {
    "default": {
        "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "OPTIONS": {
            "host": SMTP_HOST,
            "port": env_int("SMTP_PORT", 587),
            "username": env_str("SMTP_USER", ""),
            "password": env_str("SMTP_PASSWORD", ""),
            "use_tls": env_bool("SMTP_STARTTLS", True),
            "timeout": 10,
        },
    }
}
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "GPU Portal <gpuportal@localhost>")
# The portal's address as users reach it, for the links in those mails.
PORTAL_URL = env_str("PORTAL_URL", "http://127.0.0.1:8000")
# Webhooks (portal.accounts.webhooks): each user may register this many; a delivery waits this
# long for an answer. Hosts that resolve to loopback, private, link-local, multicast or reserved
# addresses are refused, at registration and at each delivery, unless an operator allows them
# here (for receivers inside the organisation's network).
WEBHOOK_MAX_PER_USER = env_int("WEBHOOK_MAX_PER_USER", 10)
WEBHOOK_TIMEOUT_S = env_int("WEBHOOK_TIMEOUT_S", 5)
WEBHOOK_ALLOW_PRIVATE_HOSTS = env_bool("WEBHOOK_ALLOW_PRIVATE_HOSTS", False)
# Where jobs' checkpoint directories live on the GPU hosts (shared storage in production).
CHECKPOINT_ROOT = env_str(
    "CHECKPOINT_ROOT", str(BASE_DIR / "var" / "checkpoints") if DEBUG else "/srv/gpuportal/checkpoints"
)
# Checkpoint garbage collection: every job keeps its newest KEEP_LATEST checkpoints and its best
# KEEP_BEST (by the metric in the marker), unless its spec says otherwise; the worker deletes the
# rest every CHECKPOINT_GC_INTERVAL_S (beat schedule above), and must see the checkpoint store at
# CHECKPOINT_ROOT to do so.
CHECKPOINT_KEEP_LATEST = env_int("CHECKPOINT_KEEP_LATEST", 2)
CHECKPOINT_KEEP_BEST = env_int("CHECKPOINT_KEEP_BEST", 1)
# Image registries jobs may name (docker.io for Docker Hub); empty: any. Agents check again
# with their own --allowed-registry list.
ALLOWED_IMAGE_REGISTRIES = env_list("ALLOWED_IMAGE_REGISTRIES", [])
# /metrics answers scrapers that show this token (Authorization: Bearer) or come from these addresses.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_ALLOWED_IPS = env_list("METRICS_ALLOWED_IPS", ["127.0.0.1", "::1"])
# A shipped scheduler profile (default, fifo, tiresias, introspective, best-fit) or the path of a
# profile JSON file.
SCHEDULER_PROFILE = env_str("SCHEDULER_PROFILE", "default")
AGENT_HEARTBEAT_INTERVAL_S = env_int("AGENT_HEARTBEAT_INTERVAL_S", 10)
AGENT_TELEMETRY_INTERVAL_S = env_int("AGENT_TELEMETRY_INTERVAL_S", 5)
# Enrollment tokens (portal.cluster.services.create_enrollment_token) live this long unless the
# admin asks for another lifetime, and never longer than the maximum.
ENROLLMENT_TOKEN_TTL_MINUTES = env_int("ENROLLMENT_TOKEN_TTL_MINUTES", 60)
ENROLLMENT_TOKEN_MAX_TTL_MINUTES = env_int("ENROLLMENT_TOKEN_MAX_TTL_MINUTES", 24 * 60)
# This many refused requests by one user, node or address within the window raise a security alert
# (portal.accounts.security).
SECURITY_ALERT_THRESHOLD = env_int("SECURITY_ALERT_THRESHOLD", 5)
SECURITY_ALERT_WINDOW_S = env_int("SECURITY_ALERT_WINDOW_S", 600)
# Shells in running jobs (/ws/jobs/<id>/shell/, portal.shell): at most this many open at once per
# user; a session ends when the node's agent has not answered its opening within this many
# seconds, and after this many seconds without input.
SHELL_MAX_SESSIONS_PER_USER = env_int("SHELL_MAX_SESSIONS_PER_USER", 4)
SHELL_OPEN_TIMEOUT_S = env_int("SHELL_OPEN_TIMEOUT_S", 10)
SHELL_IDLE_TIMEOUT_S = env_int("SHELL_IDLE_TIMEOUT_S", 1800)
# Single sign-on through an OpenID Connect provider (Keycloak, Azure AD / Entra ID, Google, Okta,
# Dex...), off while OIDC_ISSUER is empty. The provider must list
# PORTAL_URL + /auth/oidc/callback/ as a redirect URI of the client. A first sign-in creates the
# user (named by OIDC_USERNAME_CLAIM) unless OIDC_CREATE_USERS is false; tenant admins then add
# them to their tenants. portal.accounts.oidc has the rules.
# Exactly as the provider's discovery document gives `issuer`, trailing "/" or not: ID tokens'
# `iss` must equal it character for character (Auth0's ends in "/", Keycloak's does not).
OIDC_ISSUER = env_str("OIDC_ISSUER", "")
OIDC_CLIENT_ID = env_str("OIDC_CLIENT_ID", "")
OIDC_CLIENT_SECRET = env_str("OIDC_CLIENT_SECRET", "")
OIDC_SCOPES = env_str("OIDC_SCOPES", "openid profile email")
OIDC_USERNAME_CLAIM = env_str("OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_CREATE_USERS = env_bool("OIDC_CREATE_USERS", True)
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_TIMEOUT_S = env_int("OIDC_TIMEOUT_S", 10)
if OIDC_ISSUER and not OIDC_CLIENT_ID:
    raise ConfigError("OIDC_ISSUER is set but OIDC_CLIENT_ID is not: single sign-on needs both")

# json: one object a line with request, task, job and attempt ids (for log shippers); text: for people.
LOG_FORMAT = env_str("LOG_FORMAT", "text" if DEBUG else "json")
if LOG_FORMAT not in ("json", "text"):
    raise ConfigError(f"LOG_FORMAT must be json or text, not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "portal.lib.logging.JsonFormatter"},
        "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # httpx logs every request's URL at INFO: a webhook's URL is a credential (a chat tool's is).
    "loggers": {"httpx": {"level": "WARNING"}},
}
