"""The I/O shell that keeps KV-aware routing current: ZMQ KV-event subscriptions and load polling.

Routing itself (`trio_direct.routing`) is sans-IO; this package moves frames and poll results into it.
"""
