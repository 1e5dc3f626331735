"""Issue 42's probes, through the real CLI on the tiny target: nothing non-finite is published,
every save and load failure is a clean error (a full disk or file-size limit exits 4 with what to
free, names the file and leaves no temporary file; a truncated target names its file), a corrupt
store is refused before `train` writes anything, published files get the umask's mode, and
messages name the right thing (the template, the flags).

Full disks are real: a small tmpfs where this machine may mount one (else those tests skip), and
the file-size limit (RLIMIT_FSIZE, soft, in this process: a write past it fails with EFBIG, as
`ulimit -f` makes it) everywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import Result

from draftsmith.draft.checkpoint import save_drafter
from tests.helpers import (
    cli,
    failed,
    make_tiny_drafter,
    prepared_chats,
    random_drafter,
    tiny_train_args,
    write_exchanges,
)


@contextlib.contextmanager
def file_size_limit(nbytes: int) -> Iterator[None]:
    """Writes past `nbytes` fail with EFBIG (Python ignores SIGXFSZ), as under `ulimit -f`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root); the file-size-limit tests take the same path")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def leftovers(folder: Path) -> list[str]:
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.endswith(".tmp") or ".tmp" in p.parent.name
    )


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory, tiny_target_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("failures")
    return prepared_chats(root, tiny_target_dir)[1]


def train(ds: Path, target: Path, out: Path, *extra: object) -> Result:
    """A tiny run; a draft vocab of 300 keeps its checkpoints small (a drafter is ~13 MB: the target's embeddings)."""
    vocab = () if "--draft-vocab-size" in extra else ("--draft-vocab-size", "300")
    return cli(*tiny_train_args(ds, target, out, *vocab, *extra))


# -- 1. nothing non-finite is published ----------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["train", "DS", "--lr", "inf"],
        ["train", "DS", "--lr", "nan"],
        ["train", "DS", "--aux-noise", "inf"],
        ["eval", "--drafter", "DS", "--temperature", "nan"],
        ["synth", "--timeout", "inf"],
        ["extract", "DS", "--check-tol", "inf"],
    ],
    ids=lambda a: " ".join(a[:1] + a[-2:]),
)
def test_a_non_finite_option_is_refused_at_parse(
    args: list[str], ds: Path, tiny_target_dir: Path, tmp_path: Path
) -> None:
    r = cli(*[ds if a == "DS" else a for a in args], "--target", tiny_target_dir, "--out", tmp_path / "out")
    failed(r, 2, f"{args[-2]}: Input should be a finite number")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_diverging_lr_publishes_nothing_and_is_named(ds: Path, tiny_target_dir: Path, tmp_path: Path) -> None:
    """--lr 1e30: the first update leaves the weights finite but so large that the next forward
    overflows. Validation at step 1 (loss NaN) must not publish, the error must blame --lr (the
    data is finite), and no checkpoint is saved."""
    out = tmp_path / "run"
    failed(
        train(ds, tiny_target_dir, out, "--steps", "3", "--val-every", "1", "--save-every", "1", "--lr", "1e30"),
        2,
        "validation at step 1: the loss is nan",
        "the learning rate --lr 1e+30 is too high",
        "its input data is finite",
    )
    assert not (out / "drafter").exists() and not (out / "checkpoints").exists()


def test_a_drafter_with_inf_weights_is_never_saved(
    ds: Path, tiny_target_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update that makes a weight Inf (here: the optimizer step itself) is caught before any
    save or publish, and named as the learning rate's doing."""
    from draftsmith.train.optim import Optimizers

    step = Optimizers.step

    def overflowing(self: Optimizers) -> None:
        step(self)
        for group in self.optimizers[0].param_groups:
            group["params"][0].data.fill_(float("inf"))

    monkeypatch.setattr(Optimizers, "step", overflowing)
    out = tmp_path / "run"
    failed(
        train(ds, tiny_target_dir, out, "--steps", "2", "--save-every", "1"),
        2,
        "the update of step 1 made the drafter's weights NaN or Inf",
        "--lr",
    )
    assert not (out / "drafter").exists() and not (out / "checkpoints").exists()


def test_a_one_token_draft_vocab_is_refused(ds: Path, tiny_target_dir: Path, tmp_path: Path) -> None:
    failed(
        train(ds, tiny_target_dir, tmp_path / "run", "--steps", "1", "--draft-vocab-size", "1"),
        2,
        "--draft-vocab-size: a draft vocab of 1 token(s) cannot be trained",
        "the loss is 0",
    )
    assert not (tmp_path / "run").exists()
    failed(cli("vocab", ds, "--draft-vocab-size", "1", "--out", tmp_path / "v.safetensors"), 2, "cannot be trained")


def _nan_weights(folder: Path) -> Path:
    state = load_file(str(folder / "model.safetensors"))
    state["fc.weight"][0, 0] = float("nan")
    save_file(state, str(folder / "model.safetensors"))
    return folder


def test_eval_refuses_a_nan_drafter_as_export_does(tiny_target_dir: Path, tiny_model, tmp_path: Path) -> None:
    drafter = _nan_weights(save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "drafter"))
    failed(
        cli(
            "eval",
            "--target",
            tiny_target_dir,
            "--drafter",
            drafter,
            "--out",
            tmp_path / "eval",
            "--device",
            "cpu",
            "--num-questions",
            "1",
            "--max-new-tokens",
            "4",
        ),
        2,
        "NaN or Inf weights in fc.weight",
        "cannot be evaluated",
    )
    assert not (tmp_path / "eval").exists()


# -- 2. every save and load failure is a clean error ---------------------------------------------


@pytest.mark.slow
def test_train_at_the_file_size_limit_exits_4_and_leaves_no_temporary_drafter(
    ds: Path, tiny_target_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with file_size_limit(2_000_000):  # run.yaml, the vocab, metrics and checkpoints fit; a drafter (~13 MB) does not
        r = train(ds, tiny_target_dir, out, "--steps", "2", "--save-every", "1")
    failed(r, 4, "File too large", "ulimit -f", "rerun with --resume")
    assert str(out) in r.output and leftovers(out) == [] and not (out / "drafter").exists()


def test_export_on_a_full_disk_exits_4_with_nothing_left(tmp_path: Path) -> None:
    drafter = save_drafter(make_tiny_drafter(), tmp_path / "drafter")
    with tmpfs(tmp_path / "small", "64k") as disk:
        r = cli("export", drafter, "--out", disk / "export")
        failed(r, 4, "model.safetensors: disk full", "free some space", f"nothing was written at {disk / 'export'}")
        assert os.listdir(disk) == []


@pytest.mark.slow
def test_eval_at_the_file_size_limit_exits_4_with_nothing_left(
    tiny_target_dir: Path, tiny_model, tmp_path: Path
) -> None:
    drafter = save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "drafter")
    args = ["--device", "cpu", "--num-questions", "1", "--max-new-tokens", "4", "--no-speed"]
    with file_size_limit(2000):  # the report's plots are larger
        r = cli("eval", "--target", tiny_target_dir, "--drafter", drafter, "--out", tmp_path / "eval", *args)
    failed(r, 4, "File too large", f"nothing was written at {tmp_path / 'eval'}")
    assert "what was written is kept" not in r.output and not (tmp_path / "eval").exists()
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_train_on_a_full_disk_exits_4_and_resumes(ds: Path, tiny_target_dir: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "2m") as disk:
        out = disk / "run"
        r = train(ds, tiny_target_dir, out, "--steps", "2", "--save-every", "1")
        failed(r, 4, "disk full", "free some space", "rerun with --resume")
        assert leftovers(out) == [] and not (out / "drafter").exists()
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # space freed
        r = train(ds, tiny_target_dir, out, "--steps", "2", "--save-every", "1", "--resume")
        assert r.exit_code == 0 and (out / "drafter" / "drafter.json").exists(), r.output


@pytest.mark.parametrize("command", ["prepare", "vocab"])
def test_prepare_and_vocab_at_the_file_size_limit_name_the_file_and_keep_nothing(
    command: str, ds: Path, tiny_target_dir: Path, tmp_path: Path
) -> None:
    exchanges = ((f"Count from {i}.", f"{i}, {i * 7 + 1}, {i * 13 + 2}.") for i in range(300))
    chats = write_exchanges(tmp_path / "chats.jsonl", exchanges)  # ~10 KB of parquet, even compressed
    out = tmp_path / ("ds" if command == "prepare" else "v.safetensors")
    args = ["prepare", chats, "--target", tiny_target_dir] if command == "prepare" else ["vocab", ds]
    with file_size_limit(2000):
        r = cli(*args, "--out", out)
    name = "data.parquet" if command == "prepare" else "v.safetensors"
    failed(r, 4, f"{name}: ", "ulimit -f", f"{out} ")
    assert "what was written is kept" not in r.output
    assert os.listdir(tmp_path) == ["chats.jsonl"]


@pytest.fixture(scope="module")
def truncated_target(tmp_path_factory: pytest.TempPathFactory, tiny_target_dir: Path) -> Path:
    folder = shutil.copytree(tiny_target_dir, tmp_path_factory.mktemp("truncated") / "target")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folder


@pytest.mark.parametrize("command", ["extract", "eval", "synth"])
def test_a_truncated_target_is_named(
    command: str, truncated_target: Path, ds: Path, tiny_model, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = {
        "extract": ["extract", ds],
        "synth": ["synth", ds.parent / "chats.jsonl"],
        "eval": ["eval", "--drafter", save_drafter(random_drafter(tiny_model, draft_vocab_size=300), tmp_path / "d")],
    }[command]
    r = cli(
        *args, "--target", truncated_target, "--out", out / "x.jsonl" if command == "synth" else out, "--device", "cpu"
    )
    failed(r, 2, f"{truncated_target / 'model.safetensors'}: truncated or corrupt; copy the model again")
    assert not out.exists()


# -- 3. lower items ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_corrupt_store_row_is_refused_before_train_writes(ds: Path, tiny_target_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    r = cli("extract", ds, "--target", tiny_target_dir, "--out", store, "--device", "cpu")
    assert r.exit_code == 0, r.output
    sample = sorted(store.glob("rows_*/*.safetensors"))[-1]
    data = sample.read_bytes()
    sample.write_bytes(
        data[:-3] + bytes(b ^ 0xFF for b in data[-3:])
    )  # flipped bytes: the size is right, the checksum not
    out = tmp_path / "run"
    failed(train(ds, tiny_target_dir, out, "--hidden", store, "--steps", "1"), 2, f"{sample}: sample", "is corrupt")
    assert not out.exists()
    sample.write_bytes(data[:-10])  # truncated: found by its size alone
    failed(train(ds, tiny_target_dir, out, "--hidden", store, "--steps", "1"), 2, "truncated or overwritten")
    assert not out.exists()


def test_export_publishes_every_file_with_the_umask_mode(tmp_path: Path) -> None:
    out = tmp_path / "export"
    r = cli("export", save_drafter(make_tiny_drafter(), tmp_path / "drafter"), "--out", out)
    assert r.exit_code == 0, r.output
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
    assert set(modes.values()) == {oct(0o666 & ~mask)}, modes


def test_the_auto_map_refusal_names_no_missing_flag(tiny_target_dir: Path, ds: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(tiny_target_dir, tmp_path / "remote")
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="mything",
        auto_map={"AutoConfig": "configuration_mything.MyConfig", "AutoModelForCausalLM": "modeling_mything.MyModel"},
    )
    (folder / "config.json").write_text(json.dumps(config))
    r = cli("extract", ds, "--target", folder, "--out", tmp_path / "out", "--device", "cpu")
    failed(r, 2, "auto_map", "no option turns that on")
    assert "trust_remote_code=True" not in r.output


def test_k_auto_in_tree_mode_names_the_flags(tiny_target_dir: Path, tmp_path: Path) -> None:
    r = cli(
        "eval",
        "--target",
        tiny_target_dir,
        "--drafter",
        tmp_path,
        "--out",
        tmp_path / "out",
        "--depth",
        "auto",
        "--mode",
        "tree",
    )
    failed(r, 2, "--depth auto chooses a chain length")
    assert "--config" not in r.output


def test_a_chat_template_error_names_the_template_and_the_record(
    tiny_target_dir: Path, ds: Path, tmp_path: Path
) -> None:
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}{% if m['content'] == 'Say three.' %}{{ raise_exception('no threes') }}"
        "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    chats = ds.parent / "chats.jsonl"
    r = cli("prepare", chats, "--target", tiny_target_dir, "--out", tmp_path / "out", "--chat-template", template)
    failed(r, 2, f"{chats} sample line-3: --chat-template {template} failed on this conversation", "no threes")
    template.write_text("{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}")
    r = cli("prepare", chats, "--target", tiny_target_dir, "--out", tmp_path / "out", "--chat-template", template)
    failed(r, 2, f"--chat-template {template} failed", "to find the template's turn markers")
