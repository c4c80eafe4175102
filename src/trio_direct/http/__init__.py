"""The HTTP layer: the ASGI app over one route table (`app`, `routes`), and what a handler sees of a
request (`exchange`)."""
