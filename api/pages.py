"""Dashboard pages of the API: the documentation page (rendered in the browser from the
OpenAPI schema, with the project's own static files) and a user's API tokens."""
from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from core.roles import user_role

from .models import ApiToken

MAX_TOKENS = 50


def docs(request):
    return render(request, "api/docs.html")


@require_http_methods(["GET", "POST"])
def tokens(request):
    """GET: your tokens. POST action=create (name) shows the new token once; POST
    action=revoke (token id) revokes one of yours. Any role may hold tokens: a token acts
    with its owner's role, so a viewer's token only reads."""
    mine = ApiToken.objects.filter(user=request.user)
    context = {"tokens": mine, "role": user_role(request.user)}
    if request.method == "POST":
        action = request.POST.get("action", "")
        if action == "create":
            name = " ".join(request.POST.get("name", "").split())
            if not name or len(name) > 100:
                context["error"] = "Give the token a name of 1 to 100 characters (what it is for). Nothing was created."
                return render(request, "api/tokens.html", context, status=400)
            if mine.filter(revoked_at__isnull=True).count() >= MAX_TOKENS:
                context["error"] = f"You already have {MAX_TOKENS} tokens: revoke some first. Nothing was created."
                return render(request, "api/tokens.html", context, status=400)
            row, secret = ApiToken.issue(user=request.user, name=name)
            # Rendered, not redirected: the secret is shown once and never stored.
            context.update(new_token=secret, new_row=row)
            return render(request, "api/tokens.html", context, status=201)
        if action == "revoke":
            raw = request.POST.get("token", "")
            row = mine.filter(pk=int(raw)).first() if raw.isdigit() and len(raw) < 19 else None
            if row is None:
                context["error"] = "No such token of yours. Nothing was revoked."
                return render(request, "api/tokens.html", context, status=404)
            if row.revoke():
                messages.success(request, f"Revoked token {row.prefix}… ({row.name}); it no longer works.")
            else:
                messages.info(request, f"Token {row.prefix}… was already revoked.")
            return redirect("api:tokens")
        context["error"] = f"Unknown action {action[:40]!r}: use create or revoke. Nothing was changed."
        return render(request, "api/tokens.html", context, status=400)
    return render(request, "api/tokens.html", context)
