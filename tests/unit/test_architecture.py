"""The layout of docs/architecture.md holds in the code: every `draftsmith` import (module level or
inside a function) runs one way, cli -> commands -> stages -> core; no stage imports another
stage (`plan`, which times train's own step, sits above them beside the pipeline); the core
imports no stage; the drafter model imports no target loader or engine."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "draftsmith"
STAGES = {"synth", "extract", "train", "export", "evaluate", "status"}
BESIDE_PIPELINE = {"plan"}  # reads a stage's tables (train's OBJECTIVES); no stage or core part reads it
CORE = {
    "runtime",
    "draft",
    "data",
    "target",
    "gguf_cache",
    "vllm_support",
    "layers",
    "config",
    "progress",
    "fsutil",
    "errors",
    "memory",
    "torchrun",
    "assets",
}
ABOVE = {"cli", "__main__", "commands", "pipeline"}


def part(module: str) -> str:
    """draftsmith.train.loop -> train; draftsmith.target -> target."""
    return module.split(".")[1] if module.count(".") else module


def imports() -> list[tuple[str, str, str]]:
    """(file, its part, the part it imports) for every draftsmith import in the package."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        src = rel.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            out += [(str(rel), src, part(n)) for n in names if n.startswith("draftsmith.")]
    return out


def test_every_part_is_named():
    parts = {
        p.name.removesuffix(".py")
        for p in SRC.iterdir()
        if p.name != "__init__.py" and not p.name.startswith(("_", ".")) and (p.is_dir() or p.suffix == ".py")
    }
    known = STAGES | BESIDE_PIPELINE | CORE | ABOVE
    assert parts <= known | {"__main__"}, parts - known


def test_imports_run_one_way():
    wrong = []
    for file, src, dst in imports():
        if src == dst:
            continue
        if src in STAGES and dst in STAGES:
            wrong.append(f"{file} -> {dst}: a stage imports another stage")
        if src in STAGES | CORE and dst in BESIDE_PIPELINE:
            wrong.append(f"{file} -> {dst}: a stage or the core imports plan")
        if src in BESIDE_PIPELINE and dst in ABOVE:
            wrong.append(f"{file} -> {dst}: plan imports the registry, the pipeline or the face")
        if src in CORE and dst in STAGES | ABOVE:
            wrong.append(f"{file} -> {dst}: the core imports a stage or the face")
        if src in STAGES and dst in ABOVE:
            wrong.append(f"{file} -> {dst}: a stage imports the registry, the pipeline or the face")
        if src == "pipeline" and dst == "cli":
            wrong.append(f"{file} -> {dst}: the pipeline runs commands through the registry, not the face")
        if src == "commands" and dst in {"cli", "pipeline"}:
            wrong.append(f"{file} -> {dst}: the registry imports what runs it")
        if src == "draft" and dst in {"target", "runtime", "data"}:
            wrong.append(f"{file} -> {dst}: the drafter knows no target loader, engine or data format")
        if src == "runtime" and dst == "data":
            wrong.append(f"{file} -> {dst}: the runtime reads no files")
    assert not wrong, "\n".join(wrong)
