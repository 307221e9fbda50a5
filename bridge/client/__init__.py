"""The public client API: messages, producers and readers."""

from bridge.client.producer import Producer, SendResult, SendStatus
from bridge.client.reader import read_message_at, read_messages

__all__ = ["Producer", "SendResult", "SendStatus", "read_message_at", "read_messages"]
