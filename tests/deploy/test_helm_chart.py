"""deploy/helm/tritongen rendered by Helm itself (helm-python-sdk's libhelm_c) with its default
and CI values, every object validated offline (deploy/helm/check_chart.py), and the rendered pods
checked against what tritongen needs: its CLI accepts the arguments, probes hit the KServe v2
paths, GPUs follow the tensor-parallel size, the grace period outlasts the drain."""
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("helm_python", reason="helm-python-sdk (Helm v4 as a library) is not installed")
pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deploy" / "helm"))
import check_chart  # noqa: E402

CI = check_chart.CHART / "ci"


def _objects(values_file=None, **overrides):
    values = yaml.safe_load((CI / values_file).read_text()) if values_file else {}
    for key, value in overrides.items():
        node = values
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return {(o["kind"], o["metadata"]["name"]): o for o in check_chart.render(values or None)}


def _pod(objects):
    [workload] = [o for (kind, _), o in objects.items() if kind in ("Deployment", "StatefulSet")]
    return workload, workload["spec"]["template"]["spec"]


def test_every_object_of_every_values_file_validates(capsys):
    assert check_chart.main() == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    for kind in ("Deployment", "StatefulSet", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
                 "ServiceMonitor", "PodMonitor", "ScaledObject", "InferencePool", "PersistentVolumeClaim"):
        assert f": {kind} " in out, kind


def test_default_pod_is_triton_with_kserve_probes_and_one_gpu():
    from tritongen.cli import build_parser

    objects = _objects()
    workload, pod = _pod(objects)
    assert workload["kind"] == "Deployment"
    [c] = pod["containers"]
    args = build_parser().parse_args(c["command"][1:] + c["args"])  # tritongen's own CLI accepts them
    assert (args.frontend, args.host, args.tensor_parallel_size) == ("triton", "0.0.0.0", 1)
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/models/llm/ready"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {e["name"]: e["value"] for e in c["env"]}["CUDA_VISIBLE_DEVICES"] == "0"
    ports = {p["name"] for p in objects[("Service", "tritongen")]["spec"]["ports"]}
    assert ports == {"http", "grpc", "metrics"}
    assert pod["initContainers"][0]["command"] == ["tritongen", "fetch-model"]  # the default model
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/models", "/dev/shm"}


def test_tp2_pod_gets_two_gpus_and_a_cache_claim_per_replica():
    from tritongen.cli import build_parser

    objects = _objects("tp2-values.yaml")
    workload, pod = _pod(objects)
    [c] = pod["containers"]
    assert workload["kind"] == "StatefulSet" and workload["spec"]["volumeClaimTemplates"]
    assert workload["spec"]["serviceName"] in {name for kind, name in objects if kind == "Service"}
    assert build_parser().parse_args(c["command"][1:] + c["args"]).tensor_parallel_size == 2
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert {e["name"]: e["value"] for e in c["env"]}["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "replicas" not in workload["spec"]  # the HPA owns it
    hpa = objects[("HorizontalPodAutoscaler", "tritongen")]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "tritongen_num_requests_waiting"
    rules = yaml.safe_load(objects[("ConfigMap", "tritongen-prometheus-adapter-rules")]["data"]["config.yaml"])
    assert rules["rules"][0]["name"]["as"] == "tritongen_num_requests_waiting"
    monitor = objects[("ServiceMonitor", "tritongen")]["spec"]["endpoints"][0]
    assert monitor["port"] == "metrics" and monitor["path"] == "/metrics"


def test_grace_period_outlasts_the_prestop_and_the_drain():
    values = yaml.safe_load((check_chart.CHART / "values.yaml").read_text())["termination"]
    _, pod = _pod(_objects())
    sleep = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > sleep + values["drainSeconds"]
    with pytest.raises(Exception, match="gracePeriodSeconds"):
        _objects(**{"termination.gracePeriodSeconds": 20})


def test_gateway_values_give_an_inference_pool_over_openai_pods_labeled_for_the_picker():
    objects = _objects("gateway-values.yaml")
    _, pod = _pod(objects)
    workload, _ = _pod(objects)
    [c] = pod["containers"]
    assert "--frontend=openai" in c["args"] and "--port=9000" in c["args"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert workload["spec"]["template"]["metadata"]["labels"]["llm-d.ai/engine-type"] == "vllm"
    pool = objects[("InferencePool", "tritongen")]["spec"]
    assert pool["targetPorts"] == [{"number": 9000}]
    assert pool["selector"]["matchLabels"].items() <= workload["spec"]["template"]["metadata"]["labels"].items()
    config = yaml.safe_load(objects[("ConfigMap", "tritongen-epp-config")]["data"]["config.yaml"])
    weights = {p["pluginRef"]: p.get("weight") for p in config["schedulingProfiles"][0]["plugins"]}
    assert weights["prefix-cache-scorer"] == 3 and weights["queue-scorer"] == 2
    keda = objects[("ScaledObject", "tritongen")]["spec"]["triggers"][0]["metadata"]
    assert "tritongen_num_requests_waiting" in keda["query"]


@pytest.mark.parametrize("overrides, message", [
    ({"inferencePool.enabled": True}, "inferencePool needs frontend: openai"),
    ({"autoscaling.hpa.enabled": True, "autoscaling.keda.enabled": True}, "not both"),
    ({"frontend": "grpc"}, "frontend must be triton or openai"),
])
def test_inconsistent_values_fail_to_render_with_the_reason(overrides, message):
    with pytest.raises(Exception, match=message):
        _objects(**overrides)
