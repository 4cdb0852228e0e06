"""A logged-in account must hold a role (viewer, operator or admin) to see anything: an
account an admin created but never placed in a group sees a page that says so."""
from django.shortcuts import render
from django.urls import reverse

from .roles import user_role


class RoleRequiredMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and user_role(user) is None:
            exempt = (reverse("logout"), reverse("login"), reverse("admin:index"))
            if not any(request.path.startswith(prefix) for prefix in exempt):
                return render(request, "core/no_role.html", status=403)
        return self.get_response(request)
