from django.core.management.base import BaseCommand

from pool.tokens import token_for


class Command(BaseCommand):
    help = (
        "Print the bearer token of a host's agent (derived from the cluster's agent secret and the "
        "host name): put it in the agent's --token-file. The host need not be registered yet."
    )

    def add_arguments(self, parser):
        parser.add_argument("host", help="host name, exactly as the pool knows it (e.g. gpu0001)")

    def handle(self, *args, **opts):
        self.stdout.write(token_for(opts["host"]))
