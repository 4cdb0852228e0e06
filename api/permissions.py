"""Roles on the API (core/roles.py): every role reads; writes need the same Django
permission the dashboard and the services check (operators and admins hold them)."""
from __future__ import annotations

from rest_framework import permissions

from core.roles import VIEWER, user_role


class RolePermission(permissions.BasePermission):
    """Read: any role. Write: the view's `write_permissions[action]` (a Django permission);
    an action without an entry is refused, so a new write cannot slip through unchecked."""

    message = "Your account has no FabricPool role (viewer, operator or admin); ask an admin for one."

    def has_permission(self, request, view):
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if user_role(user) is None:
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        if getattr(view, request.method.lower(), None) is None and user_role(user) != VIEWER:
            return True  # no such operation here: one who may write gets 405; a viewer gets 403 for any write
        needed = getattr(view, "write_permissions", {}).get(getattr(view, "action", None))
        if needed and user.has_perm(needed):
            return True
        what = getattr(view, "write_descriptions", {}).get(getattr(view, "action", None), "change anything")
        self.message = f"Only operators and admins may {what}; {user.get_username()} is {user_role(user)}. Nothing was changed."
        return False
