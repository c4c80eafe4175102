"""The HTTP layer: the server in front (`server`: hypercorn's trio worker with the limits a public
port needs), the protocol guard, the ASGI app over one route table (`app`, `routes`), and what a
handler sees of a request (`exchange`)."""
