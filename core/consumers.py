"""Websocket consumers shared by every page. Anonymous sockets are closed before accept."""
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from .roles import user_role

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NO_ROLE = 4403


class AuthenticatedConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.role = await database_sync_to_async(user_role)(user)
        if self.role is None:
            await self.close(code=CLOSE_NO_ROLE)
            return
        await self.accept()
        await self.on_authenticated()

    async def on_authenticated(self):
        pass


class HeartbeatConsumer(AuthenticatedConsumer):
    """Lets the page show whether its live connection is up."""

    async def on_authenticated(self):
        await self.send_json({"type": "hello", "user": self.scope["user"].get_username()})

    async def receive_json(self, content, **kwargs):
        if content.get("type") == "ping":
            await self.send_json({"type": "pong"})
