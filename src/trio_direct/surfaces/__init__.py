"""API surfaces: each is a request schema, a planner onto the request core, a renderer, and a row in
the route table (`trio_direct.surfaces.routes`)."""
