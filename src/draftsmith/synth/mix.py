"""`draftsmith synth --mix mix.yaml`: one file that says which prompts to answer, from where.

It holds the mix file's config, the selection (per source in the order listed, prompts ranked
by a hash of seed, source name and prompt id, walked to the source's cap past task caps,
filters and exact or near duplicates), the conversation ids `NAME:ID:sSEED`, and `mix.json`
in the output's `OUT.synth/` folder (`data.sources.mix_card` is its short form for the model card). The file's
fields, the selection rules and why a hash rather than a shuffle: docs/synth.md ("Mixes").
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from draftsmith.config import load_yaml_mapping
from draftsmith.data.config import Format
from draftsmith.data.sources import MIX_FILE, SOURCES, label, read_source, synth_folder
from draftsmith.errors import UserError
from draftsmith.fsutil import atomic_write_json, atomic_write_text
from draftsmith.synth import output
from draftsmith.synth.config import SynthConfig
from draftsmith.synth.screen import Screen
from draftsmith.synth.turns import Work


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MixSource(Strict):
    source: str = Field(description="A file or folder, a named source, hf:ORG/NAME[:SPLIT], or magpie.")
    name: str | None = Field(None, description="Name in ids and mix.json; default the source's short name.")
    cap: int | None = Field(None, gt=0, description="At most this many prompts.")
    weight: float | None = Field(None, gt=0, description="Share of the mix's total.")
    per_task_cap: int | None = Field(
        None, gt=0, description="At most this many prompts per task (an evals folder; a file or dataset is one task)."
    )
    max_turns: int | None = Field(None, gt=0, description="Keep at most N user turns (default the mix's).")
    format: Format = "auto"
    path: Path | None = Field(
        None, description="A named source: read its data from this folder instead of the package."
    )
    text_field: str | None = Field(None, description="hf: the column that holds the prompt.")
    license: str | None = Field(None, description="License to record (named sources and hub datasets know theirs).")
    turns: int = Field(1, ge=1, description="magpie: user turns per conversation.")
    origin: str | None = Field(
        None, description="Where a frozen file's prompts came from (see `freeze`); recorded as the source."
    )
    left_out: list[str] | None = Field(
        None, description="What the origin left out for licensing (recorded for the data card)."
    )


class Dedup(Strict):
    exact: bool = True
    near: float | None = Field(0.8, gt=0, le=1)


class Filters(Strict):
    min_chars: int = Field(1, ge=0)
    max_chars: int | None = Field(None, gt=0)
    scripts: list[str] | None = None
    exclude_scripts: list[str] = []


class MixConfig(Strict):
    seed: int = 0
    total: int | None = Field(None, gt=0)
    max_turns: int | None = Field(None, gt=0)
    dedup: Dedup = Dedup()
    filters: Filters = Filters()
    sources: list[MixSource] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> MixConfig:
        names = [s.name or label(s.source) for s in self.sources]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two sources are named {twice}; give each a distinct 'name'")
        if any(s.weight for s in self.sources) and self.total is None:
            raise ValueError("a source has a weight but the mix has no 'total' to share out")
        for s, n in zip(self.sources, names):
            if s.source == "magpie" and s.cap is None and s.weight is None:
                raise ValueError(
                    f"source {n!r}: magpie needs a cap or a weight (how many conversations to self-prompt)"
                )
        return self


def load_mix(path: Path) -> MixConfig:
    raw = load_yaml_mapping(path, "--mix")
    try:
        return MixConfig(**raw)
    except ValidationError as e:
        lines = [f"  {'.'.join(str(p) for p in err['loc']) or 'mix'}: {err['msg']}" for err in e.errors()]
        raise UserError(f"--mix {path}: invalid mix file:\n" + "\n".join(lines)) from None


def shares(mix: MixConfig) -> list[int | None]:
    """How many prompts each source may take: its cap, its share of `total` by weight (largest
    remainder, so the shares add up to `total`), the smaller of both, or None (all of it)."""
    weighted = [i for i, s in enumerate(mix.sources) if s.weight]
    share: dict[int, int] = {}
    if weighted:
        assert mix.total is not None
        whole = sum(mix.sources[i].weight or 0 for i in weighted)
        exact = {i: mix.total * (mix.sources[i].weight or 0) / whole for i in weighted}
        share = {i: math.floor(x) for i, x in exact.items()}
        for i in sorted(weighted, key=lambda i: share[i] - exact[i])[: mix.total - sum(share.values())]:
            share[i] += 1
    out: list[int | None] = []
    for i, s in enumerate(mix.sources):
        caps = [c for c in (s.cap, share.get(i)) if c is not None]
        out.append(min(caps) if caps else None)
    return out


def rank(seed: int, name: str, conv_id: str) -> bytes:
    return hashlib.blake2b(f"{seed}\x00{name}\x00{conv_id}".encode(), digest_size=8).digest()


def resolve_path(spec: str, base: Path) -> str:
    """A relative file path is looked up next to the mix file first, then from the working directory."""
    if spec.startswith("hf:") or spec in SOURCES or spec == "magpie" or Path(spec).is_absolute():
        return spec
    return str(base / spec) if (base / spec).exists() else spec


def mix_inputs(path: Path) -> list[str | Path]:
    """Every file or folder a mix reads, as `plan_from` finds them (a named source or `hf:` is
    no path, and `check_output` skips it): synth's output may be none of them."""
    mix = load_mix(path)
    return [p for s in mix.sources for p in (resolve_path(s.source, path.parent), s.path) if p is not None]


class MixPlan:
    """The selected conversations of a mix, what was dropped, and the synth counts per source."""

    def __init__(self, path: Path, mix: MixConfig, works: list[Work], stats: list[dict[str, Any]]) -> None:
        self.path, self.mix, self.works, self.stats = path, mix, works, stats
        self.source_of = {w.id: w.id.split(":", 1)[0] for w in works}  # names have no ':'
        self.done: Counter[str] = Counter()
        self.totals: Counter[str] = Counter(self.source_of.values())

    # -- progress ----------------------------------------------------------------------------
    def track(self, mine: list[Work]) -> None:
        """The conversations this rank produces: the totals of its per-source gauges."""
        self.totals = Counter(self.source_of[w.id] for w in mine)

    def count_done(self, ids: list[str]) -> dict[str, str]:
        """Count finished conversations (kept or dropped); returns the per-source gauges that the
        progress line, progress.json and `draftsmith status` show."""
        self.done.update(self.source_of[i] for i in ids if i in self.source_of)
        return {f"source {s['name']}": f"{self.done[s['name']]}/{self.totals[s['name']]} done" for s in self.stats}

    # -- mix.json ------------------------------------------------------------------------------
    def record(self, out: Path, synth_seed: int, finished: bool) -> dict[str, Any]:
        """mix.json's content; with `finished`, what the output files hold per source."""
        sources = [dict(s) for s in self.stats]
        if finished:
            per: dict[str, Counter[str]] = {s["name"]: Counter() for s in sources}
            outside = 0
            for path, kept in ((out, True), (output.dropped_path(out), False)):
                for rec in output.read_records(path):
                    name = self.source_of.get(str(rec["id"]))
                    if name is None:
                        outside += 1
                    elif kept:
                        per[name]["kept"] += 1
                        per[name]["truncated"] += rec.get("ended") is not None
                    else:
                        per[name][f"dropped_{rec.get('reason')}"] += 1
            for s in sources:
                c = per[s["name"]]
                s["synth"] = {
                    "kept": c.pop("kept", 0),
                    "truncated": c.pop("truncated", 0),
                    "dropped": dict(sorted(c.items())),
                }
        return {
            "mix": str(self.path),
            "output": out.name,
            "seed": self.mix.seed,
            "synth_seed": synth_seed,
            "total": self.mix.total,
            "max_turns": self.mix.max_turns,
            "dedup": self.mix.dedup.model_dump(),
            "filters": self.mix.filters.model_dump(),
            "selected": len(self.works),
            "kept": sum(s.get("synth", {}).get("kept", 0) for s in sources) if finished else None,
            "outside_mix": outside if finished else None,
            "finished": finished,
            "sources": sources,
        }

    def write(self, out: Path, synth_seed: int, finished: bool = False) -> None:
        atomic_write_json(synth_folder(out) / MIX_FILE, self.record(out, synth_seed, finished))


def select(path: Path, synth_seed: int, system: list[dict[str, str]], fmt: str = "auto") -> MixPlan:
    """Read every source of the mix file and select its prompts (see the module docstring)."""
    path = Path(path)
    mix = load_mix(path)
    screen = Screen(
        mix.filters.min_chars,
        mix.filters.max_chars,
        set(mix.filters.scripts) if mix.filters.scripts is not None else None,
        set(mix.filters.exclude_scripts),
        mix.dedup.exact,
        mix.dedup.near,
    )
    works: list[Work] = []
    stats = []
    for entry, want in zip(mix.sources, shares(mix)):
        name = entry.name or label(entry.source)
        if ":" in name:
            raise UserError(
                f"--mix {path}: source {entry.source!r}: its name {name!r} has a ':'; give it a 'name' without one"
            )
        if entry.source == "magpie":
            assert want is not None
            works += [
                Work(f"{name}:{i}:s{synth_seed}", f"{name}:{i}", system, [None] * entry.turns) for i in range(want)
            ]
            stats.append(
                {
                    "name": name,
                    "source": "magpie",
                    "license": "generated by the target",
                    "wanted": want,
                    "selected": want,
                    "turns": entry.turns,
                }
            )
            continue
        src = read_source(
            resolve_path(entry.source, path.parent),
            entry.format if entry.format != "auto" else fmt,
            entry.path,
            entry.text_field,
            entry.license,
        )
        task_cap = entry.per_task_cap
        max_turns = entry.max_turns or mix.max_turns
        ranked = sorted(src.convs, key=lambda c: rank(mix.seed, name, c["id"]))
        dropped: Counter[str] = Counter()
        tasks: Counter[str] = Counter()
        selected = 0
        for i, conv in enumerate(ranked):
            if want is not None and selected >= want:
                dropped["over_cap"] += len(ranked) - i
                break
            if task_cap is not None and tasks[conv["task"]] >= task_cap:
                dropped["task_cap"] += 1
                continue
            msgs = conv["messages"]
            head = [m for m in msgs[:1] if m["role"] == "system"] or system
            users = [m["content"] for m in msgs if m["role"] == "user"][:max_turns]
            prompt = [*head, *({"role": "user", "content": u} for u in users)]
            reason = screen.check(prompt)
            if reason is not None:
                dropped[reason] += 1
                continue
            screen.add(prompt)
            tasks[conv["task"]] += 1
            selected += 1
            works.append(Work(f"{name}:{conv['id']}:s{synth_seed}", conv["id"], head, users))
        stat = {
            "name": name,
            "source": entry.origin or src.spec,
            "license": src.license,
            "available": len(src.convs),
            "wanted": want,
            "selected": selected,
            "dropped": dict(sorted(dropped.items())),
            "tasks": len(tasks),
            "per_task": dict(sorted(tasks.items())) if len(tasks) > 1 else None,
            **src.skipped,
        }
        if entry.left_out:
            stat["license_excluded_tasks"] = entry.left_out
        if selected == 0:
            why = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "nothing to select"
            raise UserError(
                f"--mix {path}: source {name!r} ({src.spec}) leaves no prompt: {len(src.convs)} available, "
                f"dropped: {why}. Loosen its caps or the filters, or remove it from the mix"
            )
        stats.append(stat)
    return MixPlan(path, mix, works, stats)


def plan_from(cfg: SynthConfig) -> MixPlan:
    """The mix of a `SynthConfig` with --mix; the options that pick prompts otherwise are refused."""
    if cfg.prompts is not None or cfg.magpie is not None or cfg.limit is not None:
        raise UserError(
            "--mix lists the sources itself: give no prompt file, --magpie or --limit with it "
            "(add them to the mix file as sources and caps)"
        )
    system = [{"role": "system", "content": cfg.system}] if cfg.system else []
    return select(cfg.mix, cfg.seed, system, cfg.format)


def freeze(mix_path: Path, folder: Path) -> Path:
    """Select a mix here and write what it selected as plain files: one JSONL of prompts per
    source (`{"id", "messages"}`: the system and user turns) and `mix.yaml`, a mix of those
    files (names, licenses and Magpie entries kept; no caps, filters or de-duplication left to
    apply). Synth from the frozen mix gives the same conversation ids as from the original, on
    a machine that has neither the packages nor the hub (a GPU host without network). Returns
    the frozen mix file."""
    import yaml

    plan = select(Path(mix_path), 0, [])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for stat in plan.stats:
        name = stat["name"]
        if stat["source"] == "magpie":
            entries.append({"source": "magpie", "name": name, "cap": stat["selected"], "turns": stat["turns"]})
            continue
        lines = [
            json.dumps(
                {"id": w.source_id, "messages": [*w.system, *({"role": "user", "content": u} for u in w.users)]},
                ensure_ascii=False,
            )
            + "\n"
            for w in plan.works
            if w.id.split(":", 1)[0] == name
        ]
        atomic_write_text(folder / f"{name}.jsonl", "".join(lines))
        entry = {
            "source": f"{name}.jsonl",
            "name": name,
            "format": "messages",
            "license": stat["license"],
            "origin": stat["source"],
        }
        if stat.get("license_excluded_tasks"):
            entry["left_out"] = stat["license_excluded_tasks"]
        entries.append(entry)
    frozen = {"seed": plan.mix.seed, "dedup": {"exact": False, "near": None}, "sources": entries}
    header = f"# frozen from {mix_path} by draftsmith.synth.mix.freeze: the prompts it selected, as files\n"
    atomic_write_text(folder / "mix.yaml", header + yaml.safe_dump(frozen, sort_keys=False, allow_unicode=True))
    return folder / "mix.yaml"
