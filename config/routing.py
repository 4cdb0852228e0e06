"""Websocket routes. Every consumer behind it requires a logged-in user."""
from django.urls import path

from core.consumers import HeartbeatConsumer
from core.live_consumers import (
    HostConsumer,
    OverviewConsumer,
    PoolConsumer,
    QueueConsumer,
    TopologyConsumer,
)

websocket_urlpatterns = [
    path("ws/heartbeat/", HeartbeatConsumer.as_asgi()),
    path("ws/live/overview/", OverviewConsumer.as_asgi()),
    path("ws/live/queue/", QueueConsumer.as_asgi()),
    path("ws/live/pool/", PoolConsumer.as_asgi()),
    path("ws/live/host/<str:name>/", HostConsumer.as_asgi()),
    path("ws/live/topology/", TopologyConsumer.as_asgi()),
]
