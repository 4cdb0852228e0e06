"""OpenAPI details drf-spectacular cannot infer: the Bearer token scheme, and the error
responses every operation may give (documented, so clients and schemathesis know them)."""
from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from rest_framework import serializers


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable, e.g. invalid, not_found, changed_under_you, throttled.")
    message = serializers.CharField(help_text="A sentence for people.")
    fields = serializers.DictField(child=serializers.ListField(child=serializers.CharField()),
                                   help_text="Problems by field name; empty when not about one field.")


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


READ_ERRORS = {"401": "Not authenticated (no or bad token)", "403": "No role", "404": "Not found",
               "405": "Method not allowed", "406": "Not acceptable", "400": "Bad query parameter"}
WRITE_ERRORS = {"400": "Invalid input", "409": "Refused: the thing changed or is not in a state that allows it",
                "415": "Unsupported media type", "429": "Too many writes: try again after Retry-After seconds",
                "403": "The role does not allow this"}


class AutoSchema(SpectacularAutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        errors = dict(READ_ERRORS)
        if self.method not in ("GET", "HEAD", "OPTIONS"):
            errors.update(WRITE_ERRORS)
        for code, description in errors.items():
            if code not in responses:
                body = self._get_response_for_code(ErrorSerializer, code, direction=direction)
                body["description"] = description
                responses[code] = body
        return responses


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "A personal API token (create one on the dashboard's API tokens page)."}
