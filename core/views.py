from django.db.models import Count
from django.shortcuts import render

from fabric.models import Fabric
from fabric.selectors import STATES, TIER_ORDER, fabric_counts
from pool.models import Gpu, Host


def overview(request):
    """Counts per fabric and for the pool; every number links to the list behind it."""
    counts = fabric_counts()
    fabrics = [{"fabric": fabric, "counts": counts[fabric.pk]} for fabric in Fabric.objects.all()]
    host_states = dict(Host.objects.values_list("state").annotate(n=Count("id")).order_by())
    context = {
        "fabrics": fabrics,
        "tiers": TIER_ORDER,
        "states": STATES,
        "hosts_total": sum(host_states.values()),
        "host_states": [(state, label, host_states.get(state, 0)) for state, label in Host.State.choices],
        "gpus_total": Gpu.objects.filter(present=True).count(),
    }
    return render(request, "core/overview.html", context)
