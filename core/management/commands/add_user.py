"""Create or update a user with exactly one FabricPool role.

    manage.py add_user alice --role operator --password-env ALICE_PASSWORD

Admins get is_staff (the Django admin needs it) but never is_superuser: the admin group
holds their permissions, so what they may do stays listed in one place (core/roles.py).
"""
import os

from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from core.roles import ADMIN, ROLES


class Command(BaseCommand):
    help = "Create or update a user in the viewer, operator or admin role."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=ROLES, help="the user's role (replaces any other role)")
        password = parser.add_mutually_exclusive_group()
        password.add_argument("--password", help="new password (visible in the process list: prefer --password-env)")
        password.add_argument("--password-env", metavar="VAR", help="read the new password from environment variable VAR")

    def handle(self, *args, username, role, password=None, password_env=None, **options):
        username = username.strip()
        if not username:
            raise CommandError("the user name is empty")
        if password_env is not None:
            if password_env not in os.environ:
                raise CommandError(f"environment variable {password_env} is not set")
            password = os.environ[password_env]
        if password is not None and password == "":
            raise CommandError("the password is empty")

        User = get_user_model()
        groups = {group.name: group for group in Group.objects.filter(name__in=ROLES)}
        if role not in groups:
            raise CommandError(f"role group {role!r} does not exist: run `manage.py migrate` first")

        with transaction.atomic():
            user = User.objects.filter(username=username).first()
            created = user is None
            if created:
                user = User(username=username)
            if password is not None:
                try:
                    password_validation.validate_password(password, user)
                except ValidationError as exc:
                    raise CommandError(f"password rejected: {' '.join(exc.messages)}") from None
                user.set_password(password)
            elif created:
                user.set_unusable_password()
            old_role = None if created else next((g.name for g in user.groups.all() if g.name in ROLES), None)
            was_superuser = user.is_superuser
            user.is_staff = role == ADMIN
            user.is_superuser = False
            user.is_active = True
            user.save()
            user.groups.remove(*[g for name, g in groups.items() if name != role])
            user.groups.add(groups[role])

        if created:
            note = "password set" if password is not None else "no password: the user cannot log in until one is set with --password-env"
            self.stdout.write(f"created user {username} with role {role} ({note})")
        else:
            changes = [f"role {old_role or 'none'} → {role}" if old_role != role else f"role {role} unchanged"]
            if was_superuser:
                changes.append("superuser status removed")
            if password is not None:
                changes.append("password changed")
            self.stdout.write(f"updated user {username}: {', '.join(changes)}")
