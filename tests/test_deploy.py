"""The Kubernetes manifests and the Dockerfile in the repository are wired together: parsed, and the
fields that connect them checked (no cluster and no Docker are needed)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from trio_direct.config import parse_serve_args

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "deploy" / "kubernetes"


def documents() -> list[dict]:
    docs: list[dict] = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


def find(kind: str, name: str) -> dict:
    matches = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}"
    return matches[0]


def container(deployment: dict) -> dict:
    [only] = deployment["spec"]["template"]["spec"]["containers"]
    return only


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, rest) of every instruction, continuation lines joined."""
    joined = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), rest.strip()))
    return out


def entrypoint() -> list[str]:
    [rest] = [rest for instruction, rest in dockerfile() if instruction == "ENTRYPOINT"]
    return yaml.safe_load(rest)  # the exec form is a JSON list


def serve_config(args: list[str]):
    """The frontend's settings: the image's entrypoint flags, then the Deployment's args."""
    command = entrypoint()
    assert command[:2] == ["trio-direct", "serve"]
    return parse_serve_args([*command[2:], *args], environ={})


def test_every_manifest_parses_and_has_a_kind_and_name():
    docs = documents()
    assert {d["kind"] for d in docs} == {"Namespace", "Secret", "Service", "Deployment"}
    namespaced = [d for d in docs if d["kind"] != "Namespace"]
    assert all(d["apiVersion"] and d["metadata"]["name"] and d["metadata"]["namespace"] == "llm" for d in namespaced)


#: The Kubernetes release whose schemas the manifests are checked against (kubernetes-validate ships
#: them: no cluster and no network needed).
KUBERNETES_VERSION = "1.33.0"


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_manifest_is_valid_against_the_kubernetes_schemas(doc):
    import kubernetes_validate

    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises on any unknown or wrong field


def test_everything_the_manifests_use_is_defined_in_them():
    """A fresh cluster has nothing: the namespace, Secrets and claims the pods name are all here."""
    docs = documents()
    defined = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Namespace", "llm") in defined
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        for volume in spec.get("volumes", []):
            claim = volume.get("persistentVolumeClaim")
            assert claim is None or ("PersistentVolumeClaim", claim["claimName"]) in defined
        for env in (e for c in spec["containers"] for e in c.get("env", [])):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                secret = find("Secret", ref["name"])
                assert ref.get("optional") or ref["key"] in secret["stringData"]


def test_the_frontend_finds_the_engines_tokenizer_by_model_id():
    """The engines report `--model-path ORG/NAME`; the frontend reads it from a Hugging Face cache it may fill."""
    frontend = container(find("Deployment", "trio-direct"))
    config = serve_config(frontend["args"])
    assert not config.model_path  # nothing mounted at a path: the model id is looked up
    engine = container(find("Deployment", "sglang"))
    model = next(arg.split("=", 1)[1] for arg in engine["command"] if arg.startswith("--model-path="))
    assert "/" in model and not model.startswith("/")
    env = {e["name"]: e for e in frontend["env"]}
    mounts = {m["mountPath"] for m in frontend["volumeMounts"]}
    assert env["HF_HOME"]["value"] in mounts


@pytest.mark.parametrize("name", ["sglang", "trio-direct", "trio-direct-state"])
def test_each_service_selects_its_deployment_s_pods_and_named_ports(name):
    service, deployment = find("Service", name), find("Deployment", name)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in container(deployment)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports


def test_the_frontend_follows_the_headless_service_of_the_engines():
    service = find("Service", "sglang")
    assert service["spec"]["clusterIP"] == "None"
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    engine = container(find("Deployment", "sglang"))
    assert f"--grpc-port={grpc['port']}" in engine["command"]
    assert next(p for p in engine["ports"] if p["name"] == "grpc")["containerPort"] == grpc["port"]

    config = serve_config(container(find("Deployment", "trio-direct"))["args"])
    name = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
    assert config.engine_dns == [f"{name}:{grpc['port']}"]
    assert config.host == "0.0.0.0"


def test_the_frontend_is_probed_on_live_and_health_at_the_port_it_serves():
    frontend = container(find("Deployment", "trio-direct"))
    config = serve_config(frontend["args"])
    port = next(p for p in frontend["ports"] if p["name"] == frontend["readinessProbe"]["httpGet"]["port"])
    assert port["containerPort"] == config.port
    assert frontend["livenessProbe"]["httpGet"]["path"] == "/live"
    assert frontend["readinessProbe"]["httpGet"]["path"] == "/health"
    assert frontend["resources"]["requests"]["cpu"] == str(config.workers)


def test_shutdowns_last_long_enough_for_the_drains_they_wait_for():
    frontend = find("Deployment", "trio-direct")
    config = serve_config(container(frontend)["args"])
    grace = frontend["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > config.graceful_shutdown_timeout + config.drain_timeout + config.abort_timeout

    # An engine leaving keeps serving until every frontend noticed and drained it.
    engines = find("Deployment", "sglang")
    sleep = int(container(engines)["lifecycle"]["preStop"]["exec"]["command"][-1])
    discovery_grace = config.discovery_interval if config.discovery_grace is None else config.discovery_grace
    assert sleep > config.discovery_interval + discovery_grace + config.drain_timeout
    assert engines["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > sleep


def test_the_frontend_runs_as_the_image_s_non_root_user():
    spec = find("Deployment", "trio-direct")["spec"]["template"]["spec"]
    [user] = [rest for instruction, rest in dockerfile() if instruction == "USER"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert str(spec["securityContext"]["runAsUser"]) == user


def test_the_dockerfile_builds_from_python_slim_installs_the_package_and_serves_as_non_root():
    instructions = dockerfile()
    assert instructions[0] == ("FROM", "python:3.13-slim")
    runs = " ".join(rest for instruction, rest in instructions if instruction == "RUN")
    assert "pip install ." in runs
    [user] = [rest for instruction, rest in instructions if instruction == "USER"]
    assert user not in ("root", "0") and f"--uid {user}" in runs
    assert entrypoint()[:4] == ["trio-direct", "serve", "--host", "0.0.0.0"]
    [cmd] = [rest for instruction, rest in instructions if instruction == "CMD"]
    assert serve_config(yaml.safe_load(cmd)).engine_dns  # the default command follows a DNS name
    copied = [path for instruction, rest in instructions if instruction == "COPY" for path in shlex.split(rest)[:-1]]
    assert copied and all((ROOT / path).exists() for path in copied)


def test_the_replicas_share_the_state_store_that_the_manifests_run():
    env = {e["name"]: e.get("value") for e in container(find("Deployment", "trio-direct")).get("env", [])}
    url = env["TRIO_DIRECT_STATE_STORE"]
    assert url.startswith("redis://trio-direct-state.llm.svc.cluster.local:")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    service = find("Service", "trio-direct-state")
    assert port in [p["port"] for p in service["spec"]["ports"]]
    redis = container(find("Deployment", "trio-direct-state"))
    assert redis["args"][:2] == ["--appendonly", "yes"]  # what was acknowledged survives a restart
    assert find("Deployment", "trio-direct-state")["spec"]["replicas"] == 1
