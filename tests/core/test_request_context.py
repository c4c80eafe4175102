"""Request ids: the client's X-Request-Id (or a generated one), and engine rids that are never a
prefix of one another."""

from __future__ import annotations

import itertools

from trio_direct.core.request_context import RequestContext, engine_rid, rid_tag


def test_a_client_id_is_kept_and_tags_fixed_length_rids():
    context = RequestContext.for_client_id(b"req-42")
    assert context.request_id == "req-42" and len(context.key) == 32
    assert context.tag == "req-42---------" + "-" and len(context.tag) == 16
    assert (
        engine_rid(context.tag, context.key, 3).startswith("req-42-")
        and len(engine_rid(context.tag, context.key, 3)) == 52
    )


def test_without_a_usable_id_one_is_generated():
    for value in (None, b"", b"has space", b"x" * 201, "caf\u00e9".encode(), b"tab\there"):
        context = RequestContext.for_client_id(value)
        assert context.request_id == context.key and context.tag == ""
        assert len(engine_rid(context.tag, context.key, 0)) == 36


def test_tags_are_sanitised_and_cut():
    assert rid_tag("a/b:c") == "a_b_c" + "-" * 11
    assert rid_tag("0123456789abcdef0123") == "0123456789abcde-"  # all hex: the last "-" still marks it


def test_no_rid_is_a_prefix_of_another():
    keys = ["0" * 32, "f" * 32, "0123456789abcdef" * 2]
    tags = ["", rid_tag("a"), rid_tag("0123456789abcdef0123456789"), rid_tag("0" * 15), rid_tag("req-1")]
    rids = {engine_rid(tag, key, index) for tag, key, index in itertools.product(tags, keys, (0, 1, 255))}
    for a, b in itertools.permutations(rids, 2):
        assert not b.startswith(a), (a, b)
