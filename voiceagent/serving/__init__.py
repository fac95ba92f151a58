"""The shared serving runtime: one implementation of what all three services do the same way.

server bootstrap, health, reflection and graceful shutdown (server.py), metrics (metrics.py),
configuration (config.py), the device-ceiling probe (ceilings.py), the info RPC (info.py), and several
front-end processes around one engine (frontends.py).
"""
