"""The shared serving runtime: one implementation of what all three services do the same way.

server bootstrap, health, reflection and graceful shutdown (server.py), metrics (metrics.py),
configuration (config.py), the device-ceiling probe (ceilings.py) and the info RPC (info.py).
"""
