"""Per-user API tokens. Only a SHA-256 hash of the secret is stored: the token is shown
once, when it is created, and cannot be read back. The prefix (the first characters of
the token, not secret enough to use alone) finds the row and lets people tell tokens apart."""
from __future__ import annotations

import hashlib
import hmac
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_START = "fpt_"  # nosec B105 - the public start of every token, not a secret
PREFIX_LENGTH = len(TOKEN_START) + 8


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class ApiTokenQuerySet(models.QuerySet):
    def usable(self):
        return self.filter(revoked_at__isnull=True, user__is_active=True)


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What it is for, e.g. 'laptop' or 'CI pipeline'.")
    prefix = models.CharField(max_length=PREFIX_LENGTH, db_index=True, editable=False)
    token_hash = models.CharField("SHA-256 of the token", max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"

    def __str__(self):
        return f"{self.prefix}… ({self.name}, {self.user})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @classmethod
    def issue(cls, *, user, name: str) -> tuple["ApiToken", str]:
        """A new token for `user`: the row and the secret (show it once; it is not stored)."""
        row = cls(user=user, name=name.strip()[:100] or "token")
        secret = row.set_new_secret()
        row.save()
        return row, secret

    def set_new_secret(self) -> str:
        """Give this (unsaved) row a fresh secret; returns it. Only its hash is kept."""
        secret = TOKEN_START + secrets.token_urlsafe(32)
        self.prefix, self.token_hash = secret[:PREFIX_LENGTH], hash_token(secret)
        return secret

    @classmethod
    def find(cls, presented: str) -> "ApiToken | None":
        """The usable token `presented` is, or None. Rows are found by the (non-secret) prefix
        and the hashes compared in constant time."""
        if not presented.startswith(TOKEN_START) or len(presented) > 200:
            return None
        digest = hash_token(presented)
        candidates = cls.objects.usable().filter(prefix=presented[:PREFIX_LENGTH]).select_related("user")
        for row in candidates:
            if hmac.compare_digest(digest, row.token_hash):
                return row
        return None

    def revoke(self) -> bool:
        """False when it was already revoked."""
        return bool(ApiToken.objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()))
