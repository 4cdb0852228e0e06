"""Small template helpers shared by every page."""
from datetime import datetime, timezone

from django import template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

register = template.Library()


@register.filter
def timestamp(value):
    """A moment as <time datetime=ISO>. The text is UTC; static/js/time.js rewrites it in
    the operator's browser time zone."""
    if not value:
        return mark_safe('<span class="muted">never</span>')
    if isinstance(value, datetime):
        utc = value.astimezone(timezone.utc)
        return format_html('<time datetime="{}">{} UTC</time>', utc.isoformat(timespec="seconds"), utc.strftime("%Y-%m-%d %H:%M:%S"))
    return value


@register.filter
def lookup(mapping, key):
    """`counts.tiers|lookup:tier`: the template language cannot index by a variable."""
    try:
        return mapping[key]
    except (KeyError, IndexError, TypeError):
        return ""


@register.simple_tag(takes_context=True)
def nav_current(context, url_name):
    """aria-current for the nav entry of the section the page belongs to."""
    match = getattr(context.get("request"), "resolver_match", None)
    namespace = url_name.split(":", 1)[0]
    if match is not None and match.namespace == namespace:
        return mark_safe('aria-current="page"')
    return ""
