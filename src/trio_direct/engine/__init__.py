"""Talking to SGLang engines: the gRPC transport, typed errors and the two API adapters."""
