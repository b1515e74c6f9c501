"""Read, without importing anything, which modules a peer's site reaches from the given roots by
module-level imports (function bodies are not followed: they run only when called), and report
(1) imports of a forbidden module (what pack_parts.py stripped), (2) top-level packages that are
neither the standard library, nor in the site, nor in the GPU image (gpu_image_packages.txt);
both only where reached without a guard: an import inside a try block, or under a branch on
sys.version_info / sys.platform, and everything reached through one, may fail and is not counted. Exit status 1 when either list is not
empty. For checking a site here, where the device's Python (3.12) and its CUDA are absent.

    python benchmarks/peers/check_site_imports.py /tmp/site --forbid lmdeploy.turbomind._turbomind \\
        --roots lmdeploy lmdeploy.pipeline lmdeploy.pytorch.engine.engine lmdeploy.serve.openai.api_server
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Import names whose distribution is named otherwise in gpu_image_packages.txt.
DISTRIBUTION = {"PIL": "pillow", "cv2": "opencv-python-headless", "yaml": "pyyaml", "zmq": "pyzmq",
                "google": "protobuf", "sklearn": "scikit-learn"}


def source(site: Path, module: str) -> tuple[Path | None, bool]:
    """The module's file in `site` and whether it is a package."""
    base = site.joinpath(*module.split("."))
    if (base / "__init__.py").exists():
        return base / "__init__.py", True
    return (base.with_suffix(".py"), False) if base.with_suffix(".py").exists() else (None, False)


def module_imports(site: Path, module: str, forbid: set[str]) -> list[tuple[str, bool]]:
    """(imported module, inside a try block) for each module-level import of `module`; a name
    imported from a package counts as a module when the site has it or `forbid` names it."""
    path, is_pkg = source(site, module)
    if path is None:
        return []
    package = module if is_pkg else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_try: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                continue
            # a try block, or a branch on the interpreter or platform (sys.version_info, sys.platform)
            guarded = in_try or isinstance(child, ast.Try) or (isinstance(child, ast.If)
                                                               and "sys." in ast.unparse(child.test))
            if isinstance(child, ast.Import):
                found.extend((a.name, guarded) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([child.module] if child.module else []))
                found.append((base, guarded))
                found.extend((f"{base}.{a.name}", guarded) for a in child.names
                             if source(site, f"{base}.{a.name}")[0] or f"{base}.{a.name}" in forbid)
            visit(child, guarded)

    visit(ast.parse(path.read_text()), False)
    return found


def walk(site: Path, roots: list[str], forbid: list[str], known: set[str]) -> dict:
    local = {p.name.split("-")[0].split(".")[0] for p in site.iterdir()}
    seen: dict[str, bool] = {}  # module -> reached only through guarded imports
    queue = [(r, False) for r in roots]
    hits, missing = [], {}
    while queue:
        module, via_guard = queue.pop()
        if module in seen and (seen[module] <= via_guard):
            continue  # seen already, as unguarded or as guarded as now
        seen[module] = via_guard
        parts = module.split(".")
        queue += [(".".join(parts[:i]), via_guard) for i in range(1, len(parts))]  # parents import first
        for name, guarded in module_imports(site, module, set(forbid)):
            top, guarded = name.split(".")[0], guarded or via_guard
            if any(name == f or name.startswith(f + ".") for f in forbid):
                if not guarded:
                    hits.append(f"{module} imports {name}")
            elif source(site, name)[0] is not None:
                queue.append((name, guarded))
            elif (top not in sys.stdlib_module_names and top not in local and not guarded
                  and DISTRIBUTION.get(top, top).lower().replace("_", "-") not in known):
                missing.setdefault(top, module)
    return {"modules": len(seen), "forbidden": hits, "missing": missing}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", type=Path, help="a --target directory (install_parts.sh)")
    ap.add_argument("--roots", nargs="+", required=True, help="modules to start from")
    ap.add_argument("--forbid", nargs="*", default=[], help="modules that must not be imported unguarded")
    args = ap.parse_args()
    known = {line.strip().lower().replace("_", "-") for line in (HERE / "gpu_image_packages.txt").read_text()
             .splitlines() if line.strip()}
    out = walk(args.site, args.roots, args.forbid, known)
    print(f"{out['modules']} modules reached from {', '.join(args.roots)}")
    for hit in out["forbidden"]:
        print(f"FORBIDDEN {hit}")
    for top, module in sorted(out["missing"].items()):
        print(f"MISSING {top} (imported by {module}): not stdlib, not in the site, not in the image")
    return 1 if out["forbidden"] or out["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
