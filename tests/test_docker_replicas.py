"""The API replicas as deployed from docker/: compose runs two behind one HAProxy address
(docker/haproxy.cfg: health checks on /healthz, a request whose replica went away retried
on another, never a non-idempotent one that may have reached a replica), with Postgres;
the KubeRay manifests run the API as a Deployment of two, a PodDisruptionBudget, readiness
on /healthz and liveness on /livez. Static: the files, ``docker compose config`` and
``haproxy -c`` where installed; no Docker engine is needed."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.docker_files import COMPOSE, HAPROXY, container_env, find_tool, kuberay_doc, load_yaml, run
from tests.test_docker_compose import REQUIRED_SECRETS, compose

IDEMPOTENT = {"GET", "HEAD", "OPTIONS", "PUT", "DELETE"}  # RFC 9110's idempotent methods (TRACE aside)


def haproxy_sections() -> dict[str, list[str]]:
    """Each section of docker/haproxy.cfg ("global", "defaults", "backend replicas", ...) and its lines."""
    sections: dict[str, list[str]] = {}
    current = None
    for raw in HAPROXY.read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not line[0].isspace():
            current = line.strip()
            sections[current] = []
        else:
            sections[current].append(" ".join(line.split()))
    return sections


def directive(lines: list[str], name: str) -> list[str]:
    return [line[len(name) :].strip() for line in lines if line == name or line.startswith(name + " ")]


def test_compose_runs_two_api_replicas_behind_one_proxy_address():
    services = load_yaml(COMPOSE)["services"]
    api, proxy = services["api"], services["proxy"]
    assert api["deploy"]["replicas"] == "${RAYDOCK_API_REPLICAS:-2}"
    # Any number side by side: no fixed name, no host port (the proxy has the one address).
    assert "container_name" not in api and "ports" not in api
    assert api["environment"]["RAYDOCK_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "/healthz" in " ".join(api["healthcheck"]["test"])
    # A well-kept proxy image, pinned to a release.
    assert re.fullmatch(r"haproxy:\d+\.\d+\.\d+(-[a-z]+)?", proxy["image"]), proxy["image"]
    assert "./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in proxy["volumes"]
    assert proxy["ports"] == ["${RAYDOCK_API_BIND:-127.0.0.1}:${RAYDOCK_API_PORT:-8000}:8000"]
    # Drivers post their events to whichever replica answers, through the proxy.
    assert api["environment"]["RAYDOCK_PUBLIC_URL"] == "http://proxy:8000"
    # Nothing but the proxy's config mounted: it reads no data of the API or of the jobs.
    assert len(proxy["volumes"]) == 1


@pytest.mark.parametrize(("replicas", "expected"), [(None, 2), ("3", 3)])
def test_compose_resolves_the_replica_count(tmp_path, replicas, expected):
    values = dict(REQUIRED_SECRETS, **({"RAYDOCK_API_REPLICAS": replicas} if replicas else {}))
    result = compose(tmp_path, "config", "--format", "json", **values)
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert services["api"]["deploy"]["replicas"] == expected
    assert services["proxy"]["depends_on"]["api"]["condition"] == "service_started"
    assert [(p["host_ip"], p["target"]) for p in services["proxy"]["ports"]] == [("127.0.0.1", 8000)]
    assert not services["api"].get("ports")


def test_haproxy_checks_healthz_and_retries_only_what_is_safe_to_send_twice():
    sections = haproxy_sections()
    defaults, backend = sections["defaults"], sections["backend replicas"]
    assert directive(sections["frontend api"], "bind") == [":8000"]
    assert directive(sections["frontend api"], "default_backend") == ["replicas"]
    # Health: a replica is sent requests while GET /healthz answers 200 (its store answers).
    assert directive(backend, "option httpchk") == [""]
    (send,) = directive(backend, "http-check send")
    assert re.search(r"\bmeth GET uri /healthz\b", send) and "hdr Host " in send
    assert directive(backend, "http-check expect") == ["status 200"]
    assert directive(defaults, "timeout check") == ["3s"]  # past /healthz's own 1.5 s bound
    # Retries go to another replica.
    assert int(directive(defaults, "retries")[0]) >= 2
    assert directive(defaults, "option redispatch") == ["1"]
    retry_on = set(directive(defaults, "retry-on")[0].split())
    assert {"conn-failure", "empty-response", "503"} <= retry_on
    # Past a connection failure, only idempotent methods are retried: a POST that may
    # have reached a replica (a submit, a cancel) is never sent twice.
    (rule,) = directive(backend, "http-request disable-l7-retry")
    methods = re.fullmatch(r"unless \{ method ([A-Z ]+) \}", rule)
    assert methods, rule
    assert set(methods.group(1).split()) <= IDEMPOTENT and "GET" in methods.group(1).split()
    # A fresh connection per request: a replica closing its kept-alive ones is never sent one.
    assert "option http-server-close" in defaults
    # Every replica compose starts (by the default count) has a slot; found by the service's name.
    (template,) = directive(backend, "server-template")
    prefix, slots, address, *options = template.split()
    assert address == "api:8000" and int(slots) >= 2
    assert "check" in options and options[options.index("resolvers") + 1] in {
        name.split()[1] for name in sections if name.startswith("resolvers ")
    }


def test_haproxy_accepts_the_config():
    haproxy = find_tool("haproxy")
    if haproxy is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    result = run([haproxy, "-c", "-f", str(HAPROXY)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_kuberay_runs_two_api_replicas_with_a_disruption_budget():
    deployment = kuberay_doc("Deployment", "raydock-api")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    # A rollout never has fewer ready replicas than it asked for.
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = kuberay_doc("PodDisruptionBudget", "raydock-api")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["minAvailable"] == 1
    labels = spec["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # The replicas spread over nodes where there are several.
    spread = spec["template"]["spec"]["topologySpreadConstraints"][0]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"].items() <= labels.items()


def test_kuberay_readiness_follows_healthz_and_liveness_is_separate():
    pod = kuberay_doc("Deployment", "raydock-api")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    ready, live = container["readinessProbe"], container["livenessProbe"]
    assert ready["httpGet"]["path"] == "/healthz"
    assert live["httpGet"]["path"] == "/livez"
    assert ready["httpGet"]["port"] == live["httpGet"]["port"] == "http"
    # The Service drops a stopping pod before it stops listening, within its grace period.
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep" and int(pause[1]) < pod["terminationGracePeriodSeconds"]
    # Replicas share one store: PostgreSQL from the Secret.
    assert container_env(container)["RAYDOCK_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "database-url"
