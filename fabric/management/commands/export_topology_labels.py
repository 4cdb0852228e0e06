import json
import shlex

from django.core.management.base import BaseCommand, CommandError

from fabric.kubernetes import DEFAULT_PREFIX, STYLES, LabelError, label_keys, topology_labels
from fabric.management.commands.fabric_summary import resolve_fabric


class Command(BaseCommand):
    help = ("Print, per host, the Kubernetes node labels for topology-aware scheduling (Kueue, KAI-Scheduler): "
            "block (pod), rack (leaf switch) and host, as JSON or as `kubectl label` commands.")

    def add_arguments(self, parser):
        parser.add_argument("--fabric", default=None, help="fabric name (default: the only fabric)")
        parser.add_argument("--format", choices=["json", "kubectl"], default="json")
        parser.add_argument("--style", choices=list(STYLES), default="fabricpool",
                            help="label names: fabricpool (<prefix>topology-block/-rack/-host, the default) or gce "
                                 "(cloud.google.com/gce-topology-block/-subblock/-host)")
        parser.add_argument("--prefix", default=DEFAULT_PREFIX,
                            help="DNS prefix of the fabricpool style's label names (default: %(default)s; '' for none)")

    def handle(self, *args, fabric, format, style, prefix, **options):
        obj = resolve_fabric(fabric)
        try:
            keys = label_keys(style, prefix)
            labels = topology_labels(obj, keys)
        except LabelError as exc:
            raise CommandError(str(exc)) from None
        if not labels:
            raise CommandError(f"fabric {obj.name!r} has no hosts (no channel adapters with a host name)")
        if format == "json":
            levels = [keys[level] for level in ("block", "rack", "host")]
            self.stdout.write(json.dumps({"fabric": obj.name, "levels": levels, "nodes": labels}, indent=2))
            return
        self.stdout.write(f"# Kubernetes node labels for fabric {obj.name}, written by FabricPool "
                          "(node names are the host names)")
        for host, host_labels in labels.items():
            args = ["kubectl", "label", "node", host] + [f"{k}={v}" for k, v in host_labels.items()] + ["--overwrite"]
            self.stdout.write(shlex.join(args))
