"""Admins create and revoke anyone's tokens here. The token is shown once, in the message
after saving; only its hash is stored."""
from django.contrib import admin, messages
from django.utils import timezone

from .models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "user", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "prefix", "user__username"]
    fields = ["user", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields + (["user"] if obj else [])

    def save_model(self, request, obj, form, change):
        if not change:
            secret = obj.set_new_secret()
            super().save_model(request, obj, form, change)
            messages.warning(request, f"The new token for {obj.user} is {secret} — copy it now: it is not stored "
                                      "and will not be shown again.")
            return
        super().save_model(request, obj, form, change)

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        n = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        messages.success(request, f"Revoked {n} token(s).")
