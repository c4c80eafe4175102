"""The `--engine-file` format, and the file source keeping its last good list."""

from __future__ import annotations

import os

import pytest

from trio_direct.fleet.discovery import EngineSpec
from trio_direct.fleet.engine_list import EngineListError, parse_engine_list
from trio_direct.fleet.sources import FileSource


def test_json_and_yaml_lists_name_the_same_engines():
    json_text = '["grpc://a:1", {"url": "b:2", "model": "qwen3", "role": "prefill"}]'
    yaml_text = "- grpc://a:1\n- url: b:2\n  model: qwen3\n  role: prefill\n"
    expected = [EngineSpec("grpc://a:1"), EngineSpec("b:2", "qwen3", "prefill")]
    assert parse_engine_list(json_text) == parse_engine_list(yaml_text) == expected
    assert parse_engine_list('{"engines": ["grpc://a:1"]}') == [EngineSpec("grpc://a:1")]
    assert parse_engine_list("[]") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("[", "not JSON or YAML"),
        ('{"url": "a:1"}', "expected a list"),
        ('["a"]', "entry 0: engine URL 'a': no port"),
        ('["a:1", {"url": "b:2", "weight": 3}]', "entry 1: unknown key(s) weight"),
        ('[{"model": "m"}]', "entry 0: a url (string) is required"),
        ('[{"url": "a:1", "role": "leader"}]', "role must be one of aggregated, prefill, decode"),
        ('[{"url": "a:1", "model": ""}]', "model must be a non-empty string"),
        ('["grpc://a:1", "http://a:1"]', "entry 1: http://a:1 is the same engine as entry 0"),
        ("[3]", "entry 0: expected a URL or a mapping"),
    ],
)
def test_a_malformed_list_says_what_and_where(text, message):
    with pytest.raises(EngineListError) as raised:
        parse_engine_list(text)
    assert message in str(raised.value)


async def test_the_file_source_rereads_on_change_and_keeps_the_last_good_list(tmp_path, caplog):
    path = tmp_path / "engines.yaml"
    source = FileSource(path)
    assert await source.lookup() is None  # no file yet: a failure, nothing to keep
    path.write_text("- grpc://a:1\n")
    assert await source.lookup() == [EngineSpec("grpc://a:1")]
    assert await source.lookup() == [EngineSpec("grpc://a:1")]  # unchanged: not parsed again, same list

    path.write_text("- grpc://a:1\n- url: [oops\n")
    assert await source.lookup() is None  # malformed: the state keeps what it had
    assert "is malformed" in caplog.text and "keeping the last good list" in caplog.text
    assert await source.lookup() == [EngineSpec("grpc://a:1")]  # still malformed: the last good list

    path.write_text("- grpc://a:1\n- grpc://b:2\n")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a new mtime even on coarse clocks
    assert await source.lookup() == [EngineSpec("grpc://a:1"), EngineSpec("grpc://b:2")]
    path.unlink()
    assert await source.lookup() is None
