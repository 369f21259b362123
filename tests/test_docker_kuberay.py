"""The Kubernetes manifests in docker/kuberay: the kustomization, token auth everywhere, the
objects against the API schemas (kubernetes-validate where installed), the RayCluster's
autoscaling, storage and users, the API deployment's wiring and network policy, and
``kubectl kustomize`` builds where installed."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from tests.support.docker_files import (
    K8S_VERSIONS,
    KUBERAY,
    SHARED_MOUNT,
    container_env,
    example_secret_keys,
    find_tool,
    is_under,
    kuberay_doc,
    kuberay_docs,
    kustomization,
    run,
    works,
)

# --------------------------------------------------------------------------
# Kubernetes / KubeRay

KNOWN_SPEC_KEYS = {
    "suspend",
    "managedBy",
    "autoscalerOptions",
    "headServiceAnnotations",
    "enableInTreeAutoscaling",
    "gcsFaultToleranceOptions",
    "headGroupSpec",
    "rayVersion",
    "workerGroupSpecs",
    "authOptions",
}
KNOWN_AUTOSCALER_KEYS = {
    "resources",
    "image",
    "imagePullPolicy",
    "securityContext",
    "idleTimeoutSeconds",
    "upscalingMode",
    "env",
    "envFrom",
    "volumeMounts",
    "version",
}
KNOWN_HEAD_KEYS = {"template", "headService", "enableIngress", "rayStartParams", "serviceType"}
KNOWN_WORKER_KEYS = {
    "suspend",
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "idleTimeoutSeconds",
    "rayStartParams",
    "template",
    "scaleStrategy",
    "numOfHosts",
}


def ray_pod_templates(raycluster: dict) -> list[tuple[str, dict]]:
    spec = raycluster["spec"]
    templates = [("head", spec["headGroupSpec"]["template"])]
    templates += [(group["groupName"], group["template"]) for group in spec["workerGroupSpecs"]]
    return templates


def test_kustomization_references_existing_files():
    kust = kustomization()
    assert kust["kind"] == "Kustomization"
    for resource in kust["resources"]:
        assert (KUBERAY / resource).is_file(), resource
    generators = {g["name"]: g for g in kust["secretGenerator"]}
    assert "raydock-secrets" in generators
    # The real env file is created from the example by whoever deploys.
    assert generators["raydock-secrets"]["envs"] == ["raydock-secrets.env"]
    assert "raydock-secrets.env" in (KUBERAY / ".gitignore").read_text().split()
    assert example_secret_keys() == {"api-token", "database-url"}
    # The Ray token has a Secret of its own: the Ray pods read nothing else.
    assert generators["raydock-ray-auth"]["envs"] == ["ray-auth.env"]
    assert "ray-auth.env" in (KUBERAY / ".gitignore").read_text().split()
    assert example_secret_keys("ray-auth.env.example") == {"token"}


def test_ray_token_auth_everywhere_on_kubernetes():
    raycluster = kuberay_doc("RayCluster")
    api = kuberay_doc("Deployment", "raydock-api")["spec"]["template"]["spec"]["containers"][0]
    for label, template in [*ray_pod_templates(raycluster), ("api", {"spec": {"containers": [api]}})]:
        env = container_env(template["spec"]["containers"][0])
        assert env["RAY_AUTH_MODE"]["value"] == "token", label
        ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("raydock-ray-auth", "token"), label
        secrets = {
            e["valueFrom"]["secretKeyRef"]["name"] for e in env.values() if "secretKeyRef" in e.get("valueFrom", {})
        }
        if label != "api":
            assert secrets == {"raydock-ray-auth"}, label


def test_kubernetes_objects_are_well_formed():
    seen = set()
    for doc in kuberay_docs():
        for field in ("apiVersion", "kind", "metadata"):
            assert field in doc, f"{doc.get('kind')}: no {field}"
        name = doc["metadata"].get("name")
        assert name and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
        assert (doc["kind"], name) not in seen, f"duplicate {doc['kind']}/{name}"
        seen.add((doc["kind"], name))
        if doc["kind"] in {"Deployment", "Service", "PersistentVolumeClaim", "NetworkPolicy", "RayCluster"}:
            assert "spec" in doc, f"{doc['kind']}/{name}: no spec"


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_kubernetes_manifests_match_api_schemas(k8s_version):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install kubernetes-validate)"
    )
    if k8s_version == "latest":
        k8s_version = kubernetes_validate.utils.latest_version()

    def validate(obj: dict, label: str) -> None:
        try:
            kubernetes_validate.validate(obj, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            pytest.fail(f"{label} (Kubernetes {k8s_version}): {path}: {error.message}", pytrace=False)

    checked = []
    for doc in kuberay_docs():
        if doc["kind"] == "RayCluster":
            # No schema for the CRD itself; its pod templates are plain
            # PodTemplateSpecs and are checked as such.
            for group, template in ray_pod_templates(doc):
                wrapper = {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": f"raycluster-{group}"},
                    "template": template,
                }
                validate(wrapper, f"RayCluster/{doc['metadata']['name']} group {group}")
                checked.append(f"RayCluster/{group}")
            continue
        validate(doc, f"{doc['kind']}/{doc['metadata']['name']}")
        checked.append(doc["kind"])
    assert {"Deployment", "Service", "PersistentVolumeClaim", "Namespace"} <= set(checked)


def test_raycluster_autoscaling():
    raycluster = kuberay_doc("RayCluster")
    assert raycluster["apiVersion"] == "ray.io/v1"
    spec = raycluster["spec"]
    assert set(spec) <= KNOWN_SPEC_KEYS, f"unknown RayCluster spec fields: {set(spec) - KNOWN_SPEC_KEYS}"
    assert spec["enableInTreeAutoscaling"] is True

    options = spec["autoscalerOptions"]
    assert set(options) <= KNOWN_AUTOSCALER_KEYS, set(options) - KNOWN_AUTOSCALER_KEYS
    assert options["upscalingMode"] in {"Default", "Aggressive", "Conservative"}
    assert isinstance(options["idleTimeoutSeconds"], int) and options["idleTimeoutSeconds"] > 0

    head = spec["headGroupSpec"]
    assert set(head) <= KNOWN_HEAD_KEYS, set(head) - KNOWN_HEAD_KEYS
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert head["rayStartParams"]["num-cpus"] == "0"

    groups = spec["workerGroupSpecs"]
    names = [group["groupName"] for group in groups]
    assert len(names) == len(set(names)), "worker group names must be unique"
    for group in groups:
        assert set(group) <= KNOWN_WORKER_KEYS, set(group) - KNOWN_WORKER_KEYS
        counts = [group["minReplicas"], group.get("replicas", 0), group["maxReplicas"]]
        assert all(isinstance(n, int) for n in counts), group["groupName"]
        assert 0 <= counts[0] <= counts[1] <= counts[2], f"{group['groupName']}: min <= replicas <= max"
        assert group["maxReplicas"] > 0

    # The CRD types rayStartParams as map[string]string: numbers must be quoted.
    for params in [head["rayStartParams"], *(g["rayStartParams"] for g in groups)]:
        assert all(isinstance(v, str) for v in params.values()), params

    gpu_groups = [
        group
        for group in groups
        if "nvidia.com/gpu" in group["template"]["spec"]["containers"][0]["resources"].get("limits", {})
    ]
    cpu_groups = [group for group in groups if group not in gpu_groups]
    assert cpu_groups, "no CPU worker group"
    for group in gpu_groups:
        assert group["template"]["spec"]["containers"][0]["image"].startswith("raydock-ray-cuda")


def test_raycluster_pods_share_storage_and_run_as_non_root():
    raycluster = kuberay_doc("RayCluster")
    claim = kuberay_doc("PersistentVolumeClaim", "raydock-shared")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    for group, template in ray_pod_templates(raycluster):
        pod = template["spec"]
        ray_container = pod["containers"][0]  # KubeRay treats the first container as Ray's
        assert ray_container["image"].startswith("raydock-ray"), group
        assert pod["securityContext"]["runAsNonRoot"] is True
        volumes = {v["name"]: v for v in pod["volumes"]}
        shared = [
            name
            for name, v in volumes.items()
            if v.get("persistentVolumeClaim", {}).get("claimName") == "raydock-shared"
        ]
        mounts = {m["mountPath"]: m for m in ray_container["volumeMounts"] if shared and m["name"] == shared[0]}
        assert SHARED_MOUNT in mounts and not mounts[SHARED_MOUNT].get("readOnly"), group
        env = container_env(ray_container)
        storage = env["RAYDOCK_STORAGE_PATH"]["value"]
        assert storage.startswith(SHARED_MOUNT)
        # Jobs run here: the uploaded code packages are read-only to them, made by the job user first.
        code = mounts.get(f"{storage}/_code")
        assert code and code["readOnly"] is True, group
        assert code["subPath"] == f"{storage.removeprefix(SHARED_MOUNT + '/')}/_code", group
        made = [c for c in pod.get("initContainers", []) if f"{storage}/_code" in c.get("command", [])]
        assert made and made[0]["securityContext"]["allowPrivilegeEscalation"] is False, group


def test_api_deployment_wiring():
    raycluster = kuberay_doc("RayCluster")
    deployment = kuberay_doc("Deployment", "raydock-api")
    service = kuberay_doc("Service", "raydock-api")

    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()

    container = pod["spec"]["containers"][0]
    assert container["image"].startswith("raydock-api")
    env = container_env(container)
    # KubeRay names the head Service <cluster>-head-svc; 8265 is the Jobs API.
    assert env["RAY_ADDRESS"]["value"] == f"http://{raycluster['metadata']['name']}-head-svc:8265"
    secret_keys = example_secret_keys()
    for variable, key in (("RAYDOCK_API_TOKEN", "api-token"), ("RAYDOCK_DATABASE_URL", "database-url")):
        ref = env[variable]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "raydock-secrets" and ref["key"] == key and key in secret_keys
    assert env["RAYDOCK_STORAGE_PATH"]["value"].startswith(SHARED_MOUNT)
    # Job drivers in the Ray pods post events to the API through its Service.
    service_port = service["spec"]["ports"][0]["port"]
    assert env["RAYDOCK_PUBLIC_URL"]["value"] == f"http://{service['metadata']['name']}:{service_port}"

    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"  # a database outage restarts no replica
    port_names = {p["name"] for p in container["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in port_names

    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    shared = [n for n, v in volumes.items() if v.get("persistentVolumeClaim", {}).get("claimName") == "raydock-shared"]
    assert shared and mounts[shared[0]] == SHARED_MOUNT
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_api_pod_holds_no_service_account_token_and_keeps_its_data_off_what_jobs_write():
    pod = kuberay_doc("Deployment", "raydock-api")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    container = pod["containers"][0]
    data_dir = container_env(container)["RAYDOCK_DATA_DIR"]["value"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    holding = [path for path in mounts if is_under(data_dir, path)]
    assert holding, f"the API's data dir {data_dir} is on no volume of its own"
    data_volume = {v["name"]: v for v in pod["volumes"]}[mounts[max(holding, key=len)]]
    assert data_volume.get("persistentVolumeClaim", {}).get("claimName") != "raydock-shared"
    ray_claims = set()
    for group, template in ray_pod_templates(kuberay_doc("RayCluster")):
        ray_claims |= {
            v["persistentVolumeClaim"]["claimName"] for v in template["spec"]["volumes"] if "persistentVolumeClaim" in v
        }
        for c in template["spec"]["containers"]:
            assert not any(is_under(data_dir, m["mountPath"]) for m in c.get("volumeMounts", [])), group
    assert (
        "persistentVolumeClaim" not in data_volume
        or data_volume["persistentVolumeClaim"]["claimName"] not in ray_claims
    )


def test_head_network_policy_admits_api():
    policy = kuberay_doc("NetworkPolicy")
    raycluster = kuberay_doc("RayCluster")
    api_labels = kuberay_doc("Deployment", "raydock-api")["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector["ray.io/cluster"] == raycluster["metadata"]["name"]
    assert selector["ray.io/node-type"] == "head"
    admitted = [
        peer["podSelector"]["matchLabels"]
        for rule in policy["spec"]["ingress"]
        for peer in rule["from"]
        if any(port.get("port") == 8265 for port in rule.get("ports", [])) or not rule.get("ports")
    ]
    assert any(labels.items() <= api_labels.items() for labels in admitted)


def kustomize_command() -> list[str] | None:
    kubectl = find_tool("kubectl")
    if kubectl and works([kubectl, "kustomize", "--help"]):
        return [kubectl, "kustomize"]
    kustomize = find_tool("kustomize")
    if kustomize and works([kustomize, "version"]):
        return [kustomize, "build"]
    return None


def test_kustomize_builds(tmp_path):
    cmd = kustomize_command()
    if cmd is None:
        pytest.skip("neither kubectl nor kustomize is installed")
    work = tmp_path / "kuberay"
    shutil.copytree(KUBERAY, work)
    shutil.copy(work / "raydock-secrets.env.example", work / "raydock-secrets.env")
    shutil.copy(work / "ray-auth.env.example", work / "ray-auth.env")
    result = run([*cmd, str(work)])
    assert result.returncode == 0, result.stderr
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    kinds = {doc["kind"] for doc in docs}
    assert {
        "Namespace",
        "Secret",
        "PersistentVolumeClaim",
        "RayCluster",
        "Deployment",
        "Service",
        "NetworkPolicy",
    } <= kinds
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "raydock", doc["kind"]
    secrets = {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == "Secret"}
    secret = secrets["raydock-secrets"]
    assert secret["metadata"]["name"] == "raydock-secrets"
    assert set(secret["data"]) == {"api-token", "database-url"}
    assert set(secrets["raydock-ray-auth"]["data"]) == {"token"}
    raycluster = next(doc for doc in docs if doc["kind"] == "RayCluster")
    # The images transformer reaches into the RayCluster's pod templates too.
    images = {t["spec"]["containers"][0]["image"] for _, t in ray_pod_templates(raycluster)}
    assert images == {"raydock-ray:local", "raydock-ray-cuda:local"}


@pytest.mark.parametrize("missing", ["raydock-secrets.env", "ray-auth.env"])
def test_kustomize_build_without_secret_file_fails(tmp_path, missing):
    """No silent default credentials: without a local secret file there is
    nothing to apply."""
    cmd = kustomize_command()
    if cmd is None:
        pytest.skip("neither kubectl nor kustomize is installed")
    work = tmp_path / "kuberay"
    shutil.copytree(KUBERAY, work, ignore=shutil.ignore_patterns("raydock-secrets.env", "ray-auth.env"))
    for name in {"raydock-secrets.env", "ray-auth.env"} - {missing}:
        shutil.copy(work / f"{name}.example", work / name)
    result = run([*cmd, str(work)])
    assert result.returncode != 0
