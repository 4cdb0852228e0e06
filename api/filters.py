"""Query-parameter filters for the list endpoints, declared per view as `filter_specs`,
checked strictly (an unknown state is a 400 naming the parameter, not an empty list) and
documented in the OpenAPI schema; ordering that refuses fields it does not know."""
from __future__ import annotations

from dataclasses import dataclass, field

from django.utils.dateparse import parse_datetime
from rest_framework import exceptions, filters

MAX_TEXT = 200


@dataclass(frozen=True)
class Spec:
    name: str  # the query parameter
    lookup: str  # the ORM lookup it filters on
    kind: str = "str"  # str | choice | choices (comma-separated, for __in) | bool | int | datetime
    choices: tuple = field(default_factory=tuple)
    description: str = ""


TRUE, FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


def _parse(spec: Spec, raw: str):
    if spec.kind == "choice":
        if raw not in spec.choices:
            raise ValueError(f"unknown value {raw[:40]!r}: expected one of {', '.join(spec.choices)}")
        return raw
    if spec.kind == "choices":
        values = [v.strip() for v in raw.split(",") if v.strip()]
        bad = [v for v in values if v not in spec.choices]
        if bad or not values:
            raise ValueError(f"unknown value {(bad or [raw])[0][:40]!r}: expected one or more of "
                             f"{', '.join(spec.choices)}, separated by commas")
        return values
    if spec.kind == "bool":
        if raw.lower() in TRUE:
            return True
        if raw.lower() in FALSE:
            return False
        raise ValueError(f"expected true or false, got {raw[:40]!r}")
    if spec.kind == "int":
        if not raw.isdigit() or len(raw) > 18:
            raise ValueError(f"expected a whole number, got {raw[:40]!r}")
        return int(raw)
    if spec.kind == "datetime":
        try:
            value = parse_datetime(raw)
        except ValueError:
            value = None
        if value is None or value.tzinfo is None:
            raise ValueError(f"expected an ISO 8601 time with a time zone, e.g. 2026-01-31T12:00:00Z, got {raw[:40]!r}")
        return value
    if len(raw) > MAX_TEXT or "\x00" in raw:
        raise ValueError(f"at most {MAX_TEXT} characters, no NUL")
    return raw


class SpecFilterBackend:
    def filter_queryset(self, request, queryset, view):
        errors, where = {}, {}
        for spec in getattr(view, "filter_specs", ()):
            raw = request.query_params.get(spec.name)
            if raw is None or raw == "":
                continue
            try:
                where[spec.lookup] = _parse(spec, raw)
            except ValueError as exc:
                errors[spec.name] = [str(exc)]
        if errors:
            raise exceptions.ValidationError(errors)
        return queryset.filter(**where)

    def get_schema_operation_parameters(self, view):
        types = {"int": {"type": "integer", "minimum": 0}, "bool": {"type": "boolean"},
                 "datetime": {"type": "string", "format": "date-time"}}
        params = []
        for spec in getattr(view, "filter_specs", ()):
            schema = types.get(spec.kind) or {"type": "string", "maxLength": MAX_TEXT}
            if spec.kind == "choice":
                schema = {"type": "string", "enum": list(spec.choices)}
            elif spec.kind == "choices":
                schema = {"type": "string", "maxLength": MAX_TEXT,
                          "example": ",".join(spec.choices[:2])}
            params.append({"name": spec.name, "in": "query", "required": False, "schema": schema,
                           "description": spec.description or f"Only rows whose {spec.name} is this."})
        return params


class StrictOrderingFilter(filters.OrderingFilter):
    """?ordering=a,-b over the view's `ordering_fields`; an unknown field is a 400."""

    def get_ordering(self, request, queryset, view):
        raw = request.query_params.get(self.ordering_param)
        if raw:
            fields = [f.strip() for f in raw.split(",") if f.strip()]
            allowed = set(view.ordering_fields)
            bad = [f for f in fields if f.lstrip("-") not in allowed]
            if bad:
                raise exceptions.ValidationError({self.ordering_param: [
                    f"cannot order by {', '.join(b[:40] for b in bad)}: use {', '.join(sorted(allowed))} "
                    "(a leading - reverses)"]})
            return fields
        return self.get_default_ordering(view)

    def get_schema_operation_parameters(self, view):
        params = super().get_schema_operation_parameters(view)
        choices = sorted({p for f in view.ordering_fields for p in (f, "-" + f)})
        for p in params:
            p["description"] = f"Order by one of: {', '.join(view.ordering_fields)}; a leading - reverses."
            p["schema"] = {"type": "string", "enum": choices}
        return params
