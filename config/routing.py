"""Websocket routes. Every consumer behind it requires a logged-in user."""
from django.urls import path

from core.consumers import HeartbeatConsumer

websocket_urlpatterns = [
    path("ws/heartbeat/", HeartbeatConsumer.as_asgi()),
]
