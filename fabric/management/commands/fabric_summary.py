import json

from django.core.management.base import BaseCommand, CommandError

from fabric.models import Fabric
from fabric.summary import fabric_summary


class Command(BaseCommand):
    help = "Summarise a fabric: switches by tier, adapters, hosts, links and, per leaf, bandwidth and oversubscription."

    def add_arguments(self, parser):
        parser.add_argument("--fabric", default=None, help="fabric name (default: the only fabric)")
        parser.add_argument("--json", action="store_true", help="print JSON (keys in the README)")

    def handle(self, *args, fabric, json: bool, **options):
        obj = resolve_fabric(fabric)
        data = fabric_summary(obj)
        if json:
            self.stdout.write(_json.dumps(data, indent=2))
            return
        sw = data["switches"]
        ln = data["links"]
        self.stdout.write(f"fabric {data['fabric']}")
        self.stdout.write(f"  switches: {sw['total']} (leaf {sw['leaf']}, spine {sw['spine']}, core {sw['core']}, unknown {sw['unknown']})")
        self.stdout.write(f"  adapters: {data['adapters']} ({data['aggregation_nodes']} SHARP aggregation nodes), hosts: {data['hosts']}")
        self.stdout.write(
            f"  links: {ln['switch_switch']} switch-switch, {ln['adapter_switch']} adapter-switch; "
            f"{ln['degraded']} degraded, {ln['down']} down, {ln['missing']} missing"
        )
        for leaf in data["leaves"]:
            ratio = leaf["oversubscription"]
            self.stdout.write(
                f"  leaf {leaf['name']}: {len(leaf['hosts'])} hosts, {leaf['adapters']} adapters, "
                f"down {leaf['downlink_gbps']:g} Gb/s, up {leaf['uplink_gbps']:g} Gb/s, "
                f"oversubscription {'n/a' if ratio is None else f'{ratio:g}:1'}"
            )


_json = json


def resolve_fabric(name):
    if name:
        try:
            return Fabric.objects.get(name=name)
        except Fabric.DoesNotExist:
            known = ", ".join(Fabric.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"no fabric named {name!r} (known: {known})") from None
    fabrics = list(Fabric.objects.all()[:2])
    if len(fabrics) != 1:
        raise CommandError("name the fabric with --fabric" if fabrics else "no fabric imported yet")
    return fabrics[0]
