from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from core.security import RateLimitedAdminAuthenticationForm, RateLimitedAuthenticationForm
from core.views_metrics import metrics as metrics_view

# Both login pages count failed logins (core/security.py).
admin.site.login_form = RateLimitedAdminAuthenticationForm

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True,
                                                authentication_form=RateLimitedAuthenticationForm), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", include("api.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("fabric/", include("fabric.urls")),
    path("pool/", include("pool.urls")),
    path("scheduler/", include("scheduler.urls")),
    path("", include("core.urls_live")),
    path("", include("core.urls")),
]

# JSON for unknown URLs under /api/ (the API's error shape), Django's page elsewhere.
handler404 = "api.errors.not_found"
