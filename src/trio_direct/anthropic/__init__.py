"""Anthropic's Messages API: request schemas, error envelope and response bytes (sans-IO).

Not to be confused with the `anthropic` SDK: nothing here imports it; the tests check these bytes
against its models.
"""
