"""One error shape for every refusal of the API:

    {"error": {"code": "invalid", "message": "gpus: must be at least 1.",
               "fields": {"gpus": ["must be at least 1"]}}}

`fields` names each bad field (dotted paths for nested ones, e.g. "command.0"); it is empty
when the problem is not about one field. The services' own errors map here too: a refused
decision (stale version, wrong state, GPUs taken) is 409 with the service's sentence, an
override that breaks the job's rules is 400 with the rules under "gpus"."""
from __future__ import annotations

import re

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from scheduler import services


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _flatten(detail, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as {"field.sub": [messages]}."""
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            for field, messages in _flatten(value, name).items():
                out.setdefault(field, []).extend(messages)
    elif isinstance(detail, (list, tuple)):
        for i, value in enumerate(detail):
            if isinstance(value, (dict, list, tuple)):
                for field, messages in _flatten(value, f"{prefix}.{i}" if prefix else str(i)).items():
                    out.setdefault(field, []).extend(messages)
            else:
                out.setdefault(prefix or "non_field_errors", []).append(str(value))
    else:
        out.setdefault(prefix or "non_field_errors", []).append(str(detail))
    return out


def _summary(fields: dict[str, list[str]]) -> str:
    parts = [(f"{name}: " if name != "non_field_errors" else "") + "; ".join(m.rstrip(".") for m in messages)
             for name, messages in fields.items()]
    return ("Invalid input. " + ". ".join(parts) + ".") if parts else "Invalid input."


def error_body(code: str, message: str, fields: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def api_exception_handler(exc, context):
    if isinstance(exc, services.InvalidOverride):
        body = error_body("invalid_override", str(exc), {"gpus": list(exc.problems) or [str(exc)]})
        return Response(body, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, services.DecisionError):
        return Response(error_body(_snake(type(exc).__name__), str(exc)), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, DjangoValidationError):
        fields = {k: [str(m) for m in v] for k, v in exc.message_dict.items()} if hasattr(exc, "error_dict") \
            else {"non_field_errors": [str(m) for m in exc.messages]}
        return Response(error_body("invalid", _summary(fields), fields), status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or None)

    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # a bug: Django's 500 page and the log, not a made-up body
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        response.data = error_body("invalid", _summary(fields), fields)
    elif isinstance(exc, exceptions.APIException):
        detail = exc.detail
        message = str(detail) if not isinstance(detail, (dict, list)) else _summary(_flatten(detail))
        code = getattr(detail, "code", None) or exc.default_code
        response.data = error_body(str(code), message)
    return response


def not_found(request, exception=None):
    """Django's 404 handler: the API's JSON shape under /api/, Django's page elsewhere."""
    from django.http import JsonResponse
    from django.views.defaults import page_not_found

    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", f"No API endpoint at {request.path[:200]}."), status=404)
    return page_not_found(request, exception)
