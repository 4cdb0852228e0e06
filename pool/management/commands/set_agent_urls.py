from django.core.management.base import BaseCommand, CommandError

from fabric.models import Fabric
from pool.models import Host


class Command(BaseCommand):
    help = (
        "Point hosts' agent URLs at a template, e.g. the simulator's "
        "'http://127.0.0.1:9500/h/{host}' ({host} is the host name). Registration keeps URLs an "
        "operator set, so this is how existing hosts move."
    )

    def add_arguments(self, parser):
        parser.add_argument("--template", required=True, help="URL with {host} in it")
        parser.add_argument("--fabric", metavar="NAME", help="only the hosts of this fabric (default: every host)")
        parser.add_argument("--kind", choices=[k for k, _ in Host.AgentKind.choices],
                            help="also set the agent kind (default: leave it)")

    def handle(self, *args, **opts):
        template = opts["template"]
        if "{host}" not in template:
            raise CommandError(f"--template {template!r} has no {{host}} in it")
        try:
            example = template.format(host="gpu0001")
        except (KeyError, IndexError, ValueError) as exc:
            raise CommandError(f"--template {template!r}: only {{host}} may be in braces ({exc})") from None
        if len(example) > Host._meta.get_field("agent_url").max_length - 40:
            raise CommandError(f"--template {template!r} is too long")
        hosts = Host.objects.all()
        if opts["fabric"]:
            if not Fabric.objects.filter(name=opts["fabric"]).exists():
                raise CommandError(f"no fabric named {opts['fabric']!r}")
            hosts = hosts.filter(fabric__name=opts["fabric"])
        changed = []
        for host in hosts.only("id", "name", "agent_url", "agent_kind"):
            host.agent_url = template.format(host=host.name)
            if opts["kind"]:
                host.agent_kind = opts["kind"]
            changed.append(host)
        Host.objects.bulk_update(changed, ["agent_url", "agent_kind"], batch_size=1000)
        self.stdout.write(f"{len(changed)} hosts now poll {example.replace('gpu0001', '{host}')}")
