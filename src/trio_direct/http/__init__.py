"""The HTTP server in front of the app: hypercorn's trio worker with the limits a public port needs."""
