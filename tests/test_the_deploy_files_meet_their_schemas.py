"""deploy/compose.yaml and deploy/kubernetes/ are what their tools accept, and start rsd
and etcd with options those programs know.

- compose.yaml validates against the compose specification's JSON schema, vendored in
  deploy/schemas/ (its source and licence in deploy/schemas/README.md: no network here);
- every Kubernetes manifest validates, strictly (no unknown field), against the bundled
  schemas of ``kubernetes-validate`` for the Kubernetes version below;
- every rsd command line in them goes through rsd's own option parser
  (``rsd.cli.parse_args``: flags, values, and the rules between them, like a tokens
  file for a non-loopback listener), the Kubernetes ``$(VAR)``s filled in from the
  container's environment (its ConfigMap's values, a pod's name); every etcd flag is
  one the etcd the tests run knows (``etcd --help``), compose's ``ETCD_*`` variables
  being its flags;
- what the issue asks of them holds: three etcd members and three rsd nodes given
  ``--etcd``, a volume each, health checks on ``/healthz`` or ``/readyz``; a StatefulSet
  with volume claims, a headless Service and a client Service, probes, a
  PodDisruptionBudget, a restrictive security context, the tokens from a Secret.

No rsd and no etcd is started: the files are read, and ``etcd --help`` run once.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from support.etcd import etcd_binary

from rsd.cli import parse_args

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
SCHEMA = DEPLOY / "schemas" / "compose-spec.json"
KUBERNETES = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.30.0"  # the oldest Kubernetes the manifests are meant for
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_FIELD_SAMPLES = {"metadata.name": "rsd-0", "metadata.namespace": "default"}


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


@cache
def manifests() -> tuple[tuple[str, dict[str, Any]], ...]:
    """(file, resource) of every Kubernetes resource under deploy/kubernetes/ (read
    once: tests that change one deep-copy it)."""
    found = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for resource in yaml.safe_load_all(path.read_text()):
            if resource is not None and resource["kind"] != "Kustomization":
                found.append((path.name, resource))
    return tuple(found)


def resource(kind: str, name: str) -> dict[str, Any]:
    [found] = [r for _, r in manifests() if r["kind"] == kind and r["metadata"]["name"] == name]
    return found


@cache
def etcd_flags() -> frozenset[str]:
    """The flags the tests' etcd knows, from its ``--help``."""
    text = subprocess.run([etcd_binary(), "--help"], capture_output=True, text=True,
                          timeout=30).stdout
    return frozenset(re.findall(r"^\s+(--[a-z0-9-]+)", text, re.MULTILINE))


def _flag(arg: str) -> str:
    return arg.split("=", 1)[0]


# ---- compose ---------------------------------------------------------------------------


def test_the_compose_file_meets_the_compose_specification() -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    problems = [f"{error.json_path}: {error.message}" for error in
                validator.iter_errors(compose())]
    assert problems == []
    # The schema is strict enough to catch a slip (a misspelt key of a service).
    slipped = copy.deepcopy(compose())
    slipped["services"]["rsd1"]["comand"] = slipped["services"]["rsd1"].pop("command")
    assert not validator.is_valid(slipped)


def test_the_compose_file_runs_three_etcd_members_and_three_nodes_on_them() -> None:
    services = compose()["services"]
    etcds = {name: s for name, s in services.items() if name.startswith("etcd")}
    nodes = {name: s for name, s in services.items() if name.startswith("rsd")}
    assert len(etcds) == 3 and len(nodes) == 3
    volumes = set()
    for name, service in {**etcds, **nodes}.items():
        [volume] = service["volumes"]
        volumes.add(volume.split(":")[0])
        assert service["healthcheck"]["test"], name
    assert len(volumes) == 6 and volumes <= set(compose()["volumes"])
    for name, service in etcds.items():
        environment = service["environment"]
        assert environment["ETCD_NAME"] == name
        unknown = {f"--{key[5:].lower().replace('_', '-')}" for key in environment} - etcd_flags()
        assert not unknown, f"{name}: etcd knows no {unknown}"
    endpoints = ",".join(f"{name}:2379" for name in sorted(etcds))
    seen: set[str] = set()
    for name, service in nodes.items():
        assert service["entrypoint"] == ["rsd"]
        settings = parse_args(service["command"])
        assert settings.etcd == endpoints and settings.node == name
        assert settings.data_dir == service["volumes"][0].split(":")[1]
        assert settings.http_listen is not None and settings.tokens_file is not None
        probe = " ".join(service["healthcheck"]["test"])
        assert f"127.0.0.1:{settings.http_listen[1]}/readyz" in probe, probe
        seen.add(settings.cluster or "")
        assert set(service["secrets"]) == set(compose()["secrets"])
    assert len(seen) == 1


# ---- Kubernetes ------------------------------------------------------------------------


@pytest.mark.parametrize("where", [f"{file}:{r['kind']}/{r['metadata']['name']}"
                                   for file, r in manifests()])
def test_every_kubernetes_manifest_meets_its_schema(where: str) -> None:
    [found] = [r for file, r in manifests()
               if f"{file}:{r['kind']}/{r['metadata']['name']}" == where]
    kubernetes_validate.validate(found, KUBERNETES_VERSION, strict=True)


def test_the_kubernetes_schemas_are_strict_enough_to_catch_a_slip() -> None:
    slipped = copy.deepcopy(resource("StatefulSet", "rsd"))
    slipped["spec"]["replica"] = slipped["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(slipped, KUBERNETES_VERSION, strict=True)


def _environment(container: dict[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet fills it: fieldRefs by sample values,
    configMapKeyRefs from the ConfigMap among the manifests."""
    values = {}
    for entry in container.get("env", []):
        source = entry.get("valueFrom", {})
        if "value" in entry:
            values[entry["name"]] = entry["value"]
        elif "fieldRef" in source:
            values[entry["name"]] = _FIELD_SAMPLES[source["fieldRef"]["fieldPath"]]
        else:
            ref = source["configMapKeyRef"]
            values[entry["name"]] = resource("ConfigMap", ref["name"])["data"][ref["key"]]
    return values


def _args(container: dict[str, Any]) -> list[str]:
    environment = _environment(container)
    return [_VAR.sub(lambda m: environment[m.group(1)], arg) for arg in container["args"]]


def test_the_statefulset_runs_rsd_with_options_rsd_takes() -> None:
    nodes = resource("StatefulSet", "rsd")
    [container] = nodes["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["rsd"]
    settings = parse_args(_args(container))
    assert settings.node == "rsd-0" and settings.etcd and settings.cluster
    assert settings.advertise == ("rsd-0.rsd-nodes.default.svc.cluster.local", 7420)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert settings.data_dir == mounts["data"]
    assert str(settings.tokens_file).startswith(mounts["secret"])
    assert str(settings.cluster_token_file).startswith(mounts["secret"])
    http = settings.http_listen
    assert http is not None
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"rsd": settings.listen[1], "http": http[1]}
    etcds = resource("StatefulSet", "etcd")
    [member] = etcds["spec"]["template"]["spec"]["containers"]
    unknown = {_flag(arg) for arg in _args(member)} - etcd_flags()
    assert not unknown, f"etcd knows no {unknown}"
    names = [f"etcd-{n}.etcd:2379" for n in range(etcds["spec"]["replicas"])]
    assert settings.etcd == ",".join(names)


def test_the_kubernetes_nodes_are_probed_bounded_and_unprivileged() -> None:
    for name in ("rsd", "etcd"):
        stateful = resource("StatefulSet", name)
        spec = stateful["spec"]
        assert spec["replicas"] == 3 and spec["volumeClaimTemplates"], name
        headless = resource("Service", spec["serviceName"])["spec"]
        assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"]
        pod = spec["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            assert container["livenessProbe"] and container["readinessProbe"]
        budget = resource("PodDisruptionBudget", name)["spec"]
        assert budget["maxUnavailable"] == 1
        assert budget["selector"] == spec["selector"]
    [rsd] = resource("StatefulSet", "rsd")["spec"]["template"]["spec"]["containers"]
    assert rsd["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert rsd["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert resource("Service", "rsd")["spec"].get("clusterIP") != "None"  # the clients'
    volumes = resource("StatefulSet", "rsd")["spec"]["template"]["spec"]["volumes"]
    [secret] = [v["secret"]["secretName"] for v in volumes if "secret" in v]
    assert set(resource("Secret", secret)["stringData"]) == {"tokens", "cluster-token"}
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    assert all((KUBERNETES / name).is_file() for name in kustomization["resources"])
