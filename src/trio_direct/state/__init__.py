"""Shared state that outlives one process: stored responses, conversations, the admin API's
engines and counters, in memory, SQLite, PostgreSQL or Redis (`--state-store URL`)."""
