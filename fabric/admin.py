"""Admin for the fabric. Discovery owns switches, adapters, ports, links, counters and
events: they are shown read-only (an edit would be undone by the next import) and can
only be deleted, e.g. to forget hardware that left for good. Sites and fabrics are
edited here."""
from django.contrib import admin
from django.db.models import Q

from .models import ChannelAdapter, Fabric, FabricEvent, Link, Port, PortCounters, Site, Switch
from .models import normalize_guid


class GuidSearchMixin:
    """Operators paste GUIDs as tools print them: `0x2c903007b78b0`, `0002c903007b78b0`,
    `b8:59:9f:03:00:fc:6d:e4`. The plain search finds substrings; this adds an exact
    match on the normalized GUID (16 lowercase hex digits) in `guid_search_fields`."""

    guid_search_fields: tuple[str, ...] = ("guid",)
    guid_contains_fields: tuple[str, ...] = ()

    def get_search_results(self, request, queryset, search_term):
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        guid = normalize_guid(search_term) if search_term else None
        if guid:
            match = Q()
            for field in self.guid_search_fields:
                match |= Q(**{field: guid})
            for field in self.guid_contains_fields:
                match |= Q(**{f"{field}__contains": guid})
            results = results | queryset.filter(match)
        return results, may_have_duplicates


class DiscoveredAdmin(admin.ModelAdmin):
    """Rows written by discovery: viewable and deletable, never added or edited here."""

    show_full_result_count = False  # skip the extra COUNT(*) over 13k-row tables

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ("name", "description")
    search_fields = ("name", "description")


@admin.register(Fabric)
class FabricAdmin(admin.ModelAdmin):
    list_display = ("name", "site", "description", "last_import_at", "last_import_source")
    list_filter = ("site",)
    list_select_related = ("site",)
    search_fields = ("name", "description")
    readonly_fields = ("created_at", "last_import_at", "last_import_source")


@admin.register(Switch)
class SwitchAdmin(GuidSearchMixin, DiscoveredAdmin):
    list_display = ("description", "guid_display", "tier", "lid", "num_ports", "present", "fabric", "last_seen")
    list_filter = ("fabric", "tier", "present")
    list_select_related = ("fabric",)
    search_fields = ("description", "guid", "system_image_guid")
    guid_search_fields = ("guid", "system_image_guid")


@admin.register(ChannelAdapter)
class ChannelAdapterAdmin(GuidSearchMixin, DiscoveredAdmin):
    list_display = ("description", "host_name", "guid_display", "kind", "is_aggregation_node", "present", "fabric", "last_seen")
    list_filter = ("fabric", "kind", "is_aggregation_node", "present")
    list_select_related = ("fabric",)
    search_fields = ("description", "host_name", "guid", "system_image_guid")
    guid_search_fields = ("guid", "system_image_guid")


@admin.register(Port)
class PortAdmin(GuidSearchMixin, DiscoveredAdmin):
    list_display = ("__str__", "number", "guid", "lid", "state", "fabric")
    list_filter = ("fabric", "state")
    list_select_related = ("fabric", "switch", "adapter")
    search_fields = ("guid", "switch__description", "adapter__description", "adapter__host_name")
    guid_search_fields = ("guid", "switch__guid", "adapter__guid")
    raw_id_fields = ("switch", "adapter")


@admin.register(Link)
class LinkAdmin(GuidSearchMixin, DiscoveredAdmin):
    list_display = ("__str__", "kind", "width", "speed", "gbps", "state", "state_reason", "fabric", "last_seen")
    list_filter = ("fabric", "state", "kind", "speed", "width")
    list_select_related = ("fabric", "port_a__switch", "port_a__adapter", "port_b__switch", "port_b__adapter")
    search_fields = (
        "port_a__switch__description", "port_a__adapter__description",
        "port_b__switch__description", "port_b__adapter__description",
        "remote_description", "state_reason",
    )
    # The key names both end GUIDs: a GUID search finds every cable of that node.
    guid_contains_fields = ("key",)
    guid_search_fields = ("remote_guid",)
    raw_id_fields = ("port_a", "port_b")


@admin.register(PortCounters)
class PortCountersAdmin(GuidSearchMixin, DiscoveredAdmin):
    list_display = ("port", "read_at")
    list_select_related = ("port__switch", "port__adapter")
    list_filter = ("port__fabric",)
    search_fields = ("port__guid", "port__switch__description", "port__adapter__description")
    guid_search_fields = ("port__guid", "port__switch__guid", "port__adapter__guid")
    raw_id_fields = ("port",)
    date_hierarchy = "read_at"


@admin.register(FabricEvent)
class FabricEventAdmin(admin.ModelAdmin):
    """Events are the fabric's history: nobody writes or rewrites them by hand."""

    list_display = ("created_at", "fabric", "severity", "kind", "message")
    list_filter = ("fabric", "severity", "kind")
    list_select_related = ("fabric",)
    search_fields = ("message",)
    date_hierarchy = "created_at"
    raw_id_fields = ("link", "switch", "adapter")
    show_full_result_count = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False
