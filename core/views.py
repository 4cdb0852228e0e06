from django.shortcuts import render

from fabric.models import ChannelAdapter, Fabric, Link, Switch


def overview(request):
    context = {
        "fabrics": Fabric.objects.count(),
        "switches": Switch.objects.filter(present=True).count(),
        "adapters": ChannelAdapter.objects.filter(present=True).count(),
        "links_not_up": Link.objects.exclude(state=Link.State.UP).count(),
    }
    return render(request, "core/overview.html", context)
