import os

from django.core.management.base import BaseCommand, CommandError

from pool.tokens import agent_secret


class Command(BaseCommand):
    help = (
        "Write the cluster's agent secret (from which every host token is derived) to a file readable "
        "by its owner only, for the simulator's --token-secret-file. Keep it as secret as SECRET_KEY."
    )

    def add_arguments(self, parser):
        parser.add_argument("--write", metavar="FILE", required=True, help="file to write (created or replaced, mode 0600)")

    def handle(self, *args, **opts):
        path = opts["write"]
        try:
            # Created 0600 from the start: the secret is never readable by others, not even briefly.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(agent_secret() + "\n")
            os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
        except OSError as exc:
            raise CommandError(f"--write {path}: {exc.strerror}") from None
        if opts["verbosity"] >= 1:
            self.stderr.write(f"wrote the agent secret to {path} (mode 0600)")
