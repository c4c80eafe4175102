"""Where a model's tokenizer is found: a folder, the Hugging Face cache, an engine's archive."""

from __future__ import annotations

import hashlib
import io
import shutil
import zipfile

import pytest

from trio_direct.fleet.tokenizer_source import extract_tokenizer_archive
from trio_direct.text.model_source import HubSettings, ModelFilesNotFound, find_model_directory, looks_like_model_id


def archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zip_file:
        for name, data in files.items():
            zip_file.writestr(name, data)
    return buffer.getvalue()


def test_an_engine_archive_unpacks_once_into_a_folder_named_by_its_digest(tmp_path):
    data = archive({"tokenizer.json": b"{}", "tokenizer_config.json": b"{}"})
    digest = hashlib.sha256(data).hexdigest()
    folder = extract_tokenizer_archive(data, digest, tmp_path)
    assert folder.name == digest and (folder / "tokenizer.json").read_bytes() == b"{}"
    assert extract_tokenizer_archive(data, "", tmp_path) == folder  # reused


@pytest.mark.parametrize(
    ("files", "digest", "message"),
    [
        ({"tokenizer.json": b"{}"}, "0" * 64, "SHA-256"),
        ({"../escape.json": b"{}", "tokenizer.json": b"{}"}, "", "outside its folder"),
        ({"/etc/passwd": b"x", "tokenizer.json": b"{}"}, "", "outside its folder"),
        ({"config.json": b"{}"}, "", "no tokenizer.json"),
    ],
)
def test_a_bad_engine_archive_is_refused(tmp_path, files, digest, message):
    with pytest.raises(ValueError, match=message):
        extract_tokenizer_archive(archive(files), digest, tmp_path)
    assert not list((tmp_path / "trio-direct-engine-tokenizers").glob("*"))  # nothing half-unpacked left


def test_hub_settings_follow_huggingface_hub_s_variables(tmp_path):
    assert HubSettings.from_environ({"HF_HOME": "/h"}).cache_dir.as_posix() == "/h/hub"
    assert HubSettings.from_environ({"HF_HOME": "/h", "HF_HUB_CACHE": "/c"}).cache_dir.as_posix() == "/c"
    settings = HubSettings.from_environ({"HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_x"})
    assert settings.offline and settings.token == "hf_x"


def test_a_model_id_resolves_to_the_snapshot_refs_main_names(tmp_path, tiny_model):
    repo = tmp_path / "hub" / "models--acme--tiny"
    shutil.copytree(tiny_model, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    found = find_model_directory("acme/tiny", environ=env)
    assert found.path == repo / "snapshots" / "abc123" and "Hugging Face cache" in found.source
    assert find_model_directory(str(tiny_model), environ=env).source == "local folder"
    with pytest.raises(ModelFilesNotFound, match="HF_HUB_OFFLINE"):
        find_model_directory("acme/other", environ=env)


def test_paths_are_not_model_ids():
    assert looks_like_model_id("Qwen/Qwen3-8B") and looks_like_model_id("gpt2")
    assert not any(map(looks_like_model_id, ["/models/x", "./x", "~/x", "a/b/c", "a/../b"]))
