from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("fabric/", include("fabric.urls")),
    path("pool/", include("pool.urls")),
    path("scheduler/", include("scheduler.urls")),
    path("", include("core.urls_live")),
    path("", include("core.urls")),
]
