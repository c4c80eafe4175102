"""Choosing a worker for each request: sans-IO policies over the fleet's healthy workers."""
