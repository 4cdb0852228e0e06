"""The topology and GPU heatmap pages. The pages embed their data (json_script) and the
/data/ endpoints return the same dict as JSON, for scripts that refresh it. Unknown
parameters get the page back with a 400 and the reason, never a traceback. The heatmap with
?pick=<placement> is the override picker of that proposal (scheduler.override_preview)."""
from django.http import JsonResponse
from django.shortcuts import render

from scheduler import override_preview
from scheduler.models import Placement
from scheduler.services import DECIDE

from . import topology
from .topology import BadParameter


def _topology(request):
    """(fabric, data); data is None when there is no fabric yet. Raises BadParameter."""
    placement = topology.highlight_placement(request.GET.get("highlight", ""))
    fabric_name = request.GET.get("fabric", "")
    if not fabric_name and placement is not None:
        fabric = topology.placement_fabric(placement) or topology.pick_fabric("")
    else:
        fabric = topology.pick_fabric(fabric_name)
    color = topology.check_choice(request.GET.get("color", "") or "utilization", topology.COLORS, "colour")
    links = topology.check_choice(request.GET.get("links", "") or "health", topology.LINK_COLORS, "link colouring")
    data = topology.topology_data(fabric, color=color, links=links, placement=placement) if fabric else None
    if placement is not None and data is not None and not data["highlight"]["hosts"]:
        raise BadParameter(f"Placement {placement.pk} holds no GPU in fabric {fabric.name}.")
    return fabric, data


def _heatmap(request, placement=None):
    fabric_name = request.GET.get("fabric", "")
    if not fabric_name and placement is not None:
        fabric = topology.placement_fabric(placement) or topology.pick_fabric("")
    else:
        fabric = topology.pick_fabric(fabric_name)
    metric = topology.check_choice(request.GET.get("metric", "") or "utilization", topology.METRICS, "metric")
    return fabric, (topology.heatmap_data(fabric, metric) if fabric else None)


def _pick_placement(value: str):
    """The placement named by ?pick=, or None when not given. Raises BadParameter."""
    if not value:
        return None
    if not value.isdigit():
        raise BadParameter(f"pick={value!r} is not a placement number.")
    placement = Placement.objects.select_related("job__tenant", "job__pool").filter(pk=int(value)).first()
    if placement is None:
        raise BadParameter(f"There is no placement {value}.")
    return placement


def _pick(request, placement, data) -> dict:
    """?pick=<placement>: what the heatmap needs in pick mode for an override of that proposal."""
    context = override_preview.pick_context(placement, can_decide=request.user.has_perm(DECIDE))
    context["cells"] = override_preview.cell_ids(data["hosts"], len(data["gpus"])) if data else []
    return context


def _context(request, choices_name, choices):
    return {
        "fabrics": topology.Fabric.objects.order_by("name").values_list("name", flat=True),
        "params": {key: request.GET.get(key, "") for key in ("fabric", "color", "links", "highlight", "metric")},
        choices_name: choices,
    }


def topology_page(request):
    context = _context(request, "colors", topology.COLORS)
    context["link_colors"] = topology.LINK_COLORS
    try:
        fabric, data = _topology(request)
    except BadParameter as exc:
        context["error"] = str(exc)
        return render(request, "live/topology.html", context, status=400)
    context.update(fabric=fabric, data=data)
    return render(request, "live/topology.html", context)


def topology_json(request):
    try:
        _fabric, data = _topology(request)
    except BadParameter as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse(data if data is not None else {"error": "No fabric yet."}, status=200 if data else 404)


def heatmap_page(request):
    context = _context(request, "metrics", topology.METRICS)
    context["params"]["pick"] = request.GET.get("pick", "")
    try:
        placement = _pick_placement(request.GET.get("pick", ""))
        fabric, data = _heatmap(request, placement)
        if placement is not None:
            context["pick"] = _pick(request, placement, data)
    except BadParameter as exc:
        context["error"] = str(exc)
        return render(request, "live/heatmap.html", context, status=400)
    context.update(fabric=fabric, data=data)
    return render(request, "live/heatmap.html", context)


def heatmap_json(request):
    try:
        _fabric, data = _heatmap(request)
    except BadParameter as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse(data if data is not None else {"error": "No fabric yet."}, status=200 if data else 404)
