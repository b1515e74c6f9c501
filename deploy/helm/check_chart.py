"""Render the tritongen chart with each values file and validate every object, offline.

    python deploy/helm/check_chart.py            # default values + deploy/helm/tritongen/ci/*.yaml

Rendering is Helm's own (Helm v4 through the `helm-python-sdk` wheel's libhelm_c: `install` with a
client-only dry run, which is what `helm template` does), after `helm lint`. Core objects are
validated against the Kubernetes OpenAPI schemas of `kubernetes-validate`, 1.30 and 1.37 (strict:
unknown fields fail); the custom resources (InferencePool, ServiceMonitor, PodMonitor, ScaledObject) against the
schemas in deploy/helm/schemas/crds.json. Prints one line per object; exits 1 on any error.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import yaml

HERE = Path(__file__).resolve().parent
CHART = HERE / "tritongen"
CRD_SCHEMAS = HERE / "schemas" / "crds.json"
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")  # the chart's kubeVersion floor and the newest schemas there are


def values_files() -> list[Optional[Path]]:
    """None (the chart's defaults) and every values file under ci/."""
    return [None, *sorted((CHART / "ci").glob("*.yaml"))]


def render(values: Optional[dict], release: str = "tritongen", namespace: str = "llm") -> list[dict]:
    import helm_python as helm

    config = helm.Config(namespace=namespace, storage_driver="memory")
    try:
        manifest = config.install(str(CHART), release, values, dry_run="client", namespace=namespace)["manifest"]
    finally:
        config.close()
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def lint() -> list[str]:
    import helm_python as helm

    result = helm.lint(str(CHART), strict=False)
    return [f"{m['path']}: {m['error']}" for m in result["messages"] if m["severity"] >= 2] + list(result["errors"])


def validate(obj: dict) -> Optional[str]:
    """None if `obj` is valid, else why not."""
    import jsonschema
    import kubernetes_validate

    key = f"{obj.get('apiVersion')}/{obj.get('kind')}"
    crds = json.loads(CRD_SCHEMAS.read_text())
    if key in crds:
        errors = sorted(jsonschema.Draft202012Validator(crds[key]).iter_errors(obj), key=str)
        return "; ".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors) or None
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return f"Kubernetes {version}: {'/'.join(map(str, exc.path))}: {exc.message}"
        except kubernetes_validate.SchemaNotFoundError:
            return f"no schema for {key} in Kubernetes {version}"
    return None


def main() -> int:
    failures = 0
    for problem in lint():
        print(f"lint: {problem}")
        failures += 1
    for path in values_files():
        values = yaml.safe_load(path.read_text()) if path else None
        name = path.name if path else "values.yaml (defaults)"
        for obj in render(values):
            error = validate(obj)
            failures += error is not None
            print(f"{name}: {obj['kind']} {obj['metadata']['name']}: {error or 'valid'}")
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
