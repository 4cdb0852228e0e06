"""The three roles and what each may do. Groups are created by a data migration and kept
in step after every migrate, so permissions of models added later join their roles.

viewer   — sees everything in FabricPool, decides nothing;
operator — viewer + acts on the cluster: decides placements, drains hosts, submits jobs;
admin    — operator + administers: every permission of FabricPool's apps, users, schedules.
"""
from django.db.models import Q

APPS = ("fabric", "pool", "scheduler")
VIEWER, OPERATOR, ADMIN = "viewer", "operator", "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)

# Operator extras: (app_label, codename prefix or exact codename).
OPERATOR_EXTRA = [
    ("scheduler", "add_"),
    ("scheduler", "change_"),
    ("scheduler", "decide_placement"),
    ("pool", "change_host"),
    ("pool", "drain_host"),
]
ADMIN_APPS = APPS + ("auth", "django_celery_beat")


def role_permission_filter(role: str) -> Q:
    viewer = Q(content_type__app_label__in=APPS, codename__startswith="view_")
    if role == VIEWER:
        return viewer
    operator = viewer
    for app, code in OPERATOR_EXTRA:
        operator |= Q(content_type__app_label=app, codename__startswith=code)
    if role == OPERATOR:
        return operator
    return operator | Q(content_type__app_label__in=ADMIN_APPS)


def sync_roles(group_model, permission_model):
    for role in ROLES:
        group, _ = group_model.objects.get_or_create(name=role)
        group.permissions.set(permission_model.objects.filter(role_permission_filter(role)))


def sync_roles_after_migrate(sender, using="default", **kwargs):
    from django.contrib.auth.models import Group, Permission

    sync_roles(Group, Permission)


def user_role(user) -> str | None:
    """The highest role a user holds (superusers are admins); cached on the user object
    for the rest of the request."""
    if not user.is_authenticated:
        return None
    cached = getattr(user, "_fabricpool_role", False)
    if cached is not False:
        return cached
    role = None
    if user.is_superuser:
        role = ADMIN
    else:
        names = set(user.groups.values_list("name", flat=True))
        role = next((r for r in (ADMIN, OPERATOR, VIEWER) if r in names), None)
    user._fabricpool_role = role
    return role
