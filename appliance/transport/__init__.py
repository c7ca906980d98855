"""Transports: each turns a protocol into calls of the one ASGI app."""
