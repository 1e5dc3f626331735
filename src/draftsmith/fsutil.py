"""Small filesystem helpers: atomic files and folders, JSONL reading with line numbers.

Every file a stage publishes goes through these, so that a crash at any instant leaves either
the old content or the complete new content, never a partial file.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from draftsmith.errors import UserError, from_os_error, naming


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (after a rename) to disk, where the OS allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes, fsync: bool = True) -> None:
    """Write `data` to `path` via a temporary file in the same folder, fsync and rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; published files get normal modes
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str, fsync: bool = True) -> None:
    atomic_write_bytes(path, text.encode(), fsync=fsync)


def atomic_write_json(path: Path, obj: Any, fsync: bool = True) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n", fsync=fsync)


def append_line(path: Path, line: str) -> None:
    """Append one line with a single write() and fsync, so a line is either whole or absent
    after a crash. Readers must still ignore a trailing line without a newline."""
    data = (line.rstrip("\n") + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    except OSError as e:  # os.write names no file: a full disk's error says which one (synth's output)
        raise OSError(e.errno, e.strerror, str(path)) from None
    finally:
        os.close(fd)


LOCK_FILE = ".draftsmith.lock"
OWN_FOLDER = {"train": "run.yaml", "extract": "store.json"}  # the commands that write, resume and clean up in an
# existing folder of their own, and the file each such output holds (also one made before outputs were marked)
MADE_FILE = ".draftsmith"  # in each output folder draftsmith publishes: {"command": the command that made it}


def mark_output(folder: Path, command: str) -> None:
    """Mark `folder` as the output of `draftsmith COMMAND`: what `--overwrite` may replace. A
    folder another command marked is never re-marked (a UserError): no command takes over another's output."""
    maker = made_by(folder)
    if maker is not None and maker != command:
        raise UserError(
            f"{folder} is the output of `draftsmith {maker}`, not of `draftsmith {command}`; give another --out"
        )
    atomic_write_json(Path(folder) / MADE_FILE, {"command": command})


def made_by(folder: Path) -> str | None:
    """The command whose output `folder` is (its MADE_FILE), or None: not marked, or not a folder."""
    try:
        record = json.loads((Path(folder) / MADE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record.get("command") if isinstance(record, dict) else None


def run_folder(path: Path) -> Path | None:
    """The output folder of the draftsmith run that `path` lives in: `path` itself or the nearest
    folder above it that is marked as an output (a training run for its drafter, a dataset)."""
    return next((p for p in (path, *path.parents) if made_by(p) is not None), None)


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file or folder (device and inode: a hard link or a symbolic
    link to it counts, a copy does not); False when either is missing."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def holds_only_lock(folder: Path) -> bool:
    """Whether `folder` is empty but for an output lock (a run that stopped before writing)."""
    return all(p.name == LOCK_FILE for p in Path(folder).iterdir())


def check_owned(out: Path, real: Path, command: str, legacy: str) -> None:
    """For a command that writes into an existing folder of its own (train and extract resume
    there): an existing non-empty `real` must be this command's output, `--overwrite` or not:
    marked by it, or unmarked and holding `legacy` (a file every such output holds, written
    before outputs were marked). Anything else (a file, a folder made by hand, another
    command's output) is refused, so that nothing in it is rewritten, resumed into or deleted."""
    if not real.exists():
        return
    if not real.is_dir():
        raise UserError(
            f"--out {out} is a file, and `draftsmith {command}` writes a folder; give a new folder as --out "
            "(--overwrite never replaces a file with a folder)"
        )
    maker = made_by(real)
    if maker == command or holds_only_lock(real) or (maker is None and (real / legacy).is_file()):
        return
    why = (
        f"it is the output of `draftsmith {maker}`"
        if maker
        else f"it holds files draftsmith did not write (no {MADE_FILE} marker, no {legacy})"
    )
    raise UserError(
        f"--out {out} is not a `draftsmith {command}` output ({why}); {command} writes, resumes and cleans "
        f"up only in a folder of its own, with --overwrite or not. Give a new or empty --out, or move {out} "
        "away yourself"
    )


def check_output(
    out: Path,
    command: str,
    inputs: Iterable[Path | str | None] = (),
    overwrite: bool = False,
    folder: bool = True,
    legacy: str | None = None,
) -> Path:
    """The real path of `out` (a symbolic link followed, dangling or not) once it is safe for
    `draftsmith COMMAND` to write there, else a UserError saying why and what to do. The one rule
    of where an output may go, for every command and pipeline stage:

    - a folder output is not the current folder, the home folder or a folder above either (`/`);
    - `out` does not equal an input, hold one (a folder output), or lie inside the output folder
      of the run an input came from (a drafter's training run, a dataset: `run_folder`);
    - `out` does not equal an input by file identity (device and inode: a hard link counts);
    - a folder output that is a file is refused (no `--overwrite` turns a file into a folder);
    - a file output does not lie inside a folder another command marked as its output;
    - `--overwrite` replaces only an earlier output of the same command (its MADE_FILE says so)
      or an empty folder, never a folder draftsmith did not make;
    - with `legacy` (the commands that resume in their folder: train, extract) an existing
      non-empty folder must be this command's output even without `--overwrite` (`check_owned`).
    Inputs are the paths among the command's inputs (a named source or alias is no path: skipped).
    """
    given = Path(out)
    try:
        real = given.resolve()
    except (RuntimeError, OSError) as e:  # a symbolic link loop (RuntimeError up to Python 3.12, OSError after)
        raise UserError(
            f"--out {given}: {e}; a symbolic link on the way points back to itself: give another --out"
        ) from None
    if folder:
        for place, what in ((Path.cwd().resolve(), "the current folder"), (Path.home().resolve(), "the home folder")):
            if real == place or real in place.parents:
                where = what if real == place else f"above {what} ({place})"
                raise UserError(
                    f"--out {given} is {where}: {command} needs an output folder of its own (--overwrite "
                    f"would replace everything in it); give a new folder such as {given / command}"
                )
    for name in inputs:
        path = Path(name) if name is not None else None
        if path is None or not path.exists():
            continue
        source = path.resolve()
        if real == source or same_file(real, source) or (folder and real in source.parents):
            how = "is" if real == source else "holds"
            raise UserError(
                f"--out {given} {how} this command's input {name}: writing there would destroy what {command} "
                "reads; give another --out"
            )
        run = run_folder(source)
        if run is not None and run in real.parents:
            raise UserError(
                f"--out {given} is inside {run}, the output of the `draftsmith {made_by(run)}` run that "
                f"{name} comes from, which a rerun of that command replaces; give an --out outside {run}"
            )
    if folder and real.exists() and not real.is_dir():
        raise UserError(
            f"--out {given} is a file, and `draftsmith {command}` writes a folder (--overwrite never replaces a "
            "file with a folder); give a new folder as --out, or move the file away yourself"
        )
    if not folder:
        owner = run_folder(real.parent)
        if owner is not None and made_by(owner) != command:
            raise UserError(
                f"--out {given} is inside {owner}, the output of `draftsmith {made_by(owner)}`, whose files it could "
                f"replace and which that command's --overwrite deletes; give an --out outside {owner}"
            )
    legacy = legacy or OWN_FOLDER.get(command)
    if folder and legacy is not None:
        check_owned(given, real, command, legacy)
    if (
        overwrite
        and folder
        and real.exists()
        and made_by(real) != command
        and (not real.is_dir() or any(p.name != LOCK_FILE for p in real.iterdir()))
    ):  # an empty folder: nothing to lose
        maker = made_by(real)
        why = (
            f"it is the output of `draftsmith {maker}`"
            if maker
            else f"it has no {MADE_FILE} marker: made by hand, by another program or by a draftsmith before issue 42"
        )
        raise UserError(
            f"--overwrite: {given} was not made by `draftsmith {command}` ({why}); --overwrite replaces only "
            f"an earlier {command} output. Move it away or delete it yourself, or give another --out"
        )
    return real


@contextlib.contextmanager
def atomic_output_dir(
    out: Path, command: str, inputs: Iterable[Path | str | None] = (), overwrite: bool = False
) -> Iterator[Path]:
    """Build a whole output folder of `draftsmith COMMAND` under a temporary name, marked as its
    output, then rename it into place.

    `out` is checked first (`check_output`: where it is, against `inputs`, what `overwrite` may
    replace). An existing `out` is refused unless `overwrite`, before and again at the rename: an
    `out` that another run put there meanwhile is kept and this run's folder discarded, with an
    error. An output replaced is moved aside and deleted only once the new one is in place. On any
    error the temporary folder is removed and nothing is left at `out` (or the old output is).
    """
    given, inputs = Path(out), list(inputs)
    out = check_output(given, command, inputs, overwrite)
    if out.exists() and not overwrite:
        raise UserError(f"output folder {given} already exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
    lock = None
    try:
        lock = os.open(tmp / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)  # held while this run builds: not dead
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.write(lock, f"{os.getpid()}\n".encode())
        mark_output(tmp, command)
        yield tmp
        if out.exists() and not overwrite:
            raise UserError(
                f"{given} appeared while this run was writing (another run with the same --out?): it is "
                "kept and this run's output discarded; rerun with another --out, or --overwrite to replace it"
            )
        if out.exists():
            check_output(
                given, command, inputs, overwrite
            )  # what is there now (another run's, meanwhile) is still ours to replace
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", suffix=".tmp", dir=out.parent))
            os.replace(out, old)
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old, out)
                raise
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
        with contextlib.suppress(OSError):
            os.unlink(out / LOCK_FILE)  # published: no build lock in the output
        fsync_dir(out.parent)
    except OSError as e:  # a full disk, a file-size limit: exit 4, and nothing of this run left
        shutil.rmtree(tmp, ignore_errors=True)
        raise from_os_error(
            naming(e, given),  # a failed write() names no file: then the output it was for
            f"nothing was written at {given} (its temporary folder was removed): run the same command again",
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            os.close(lock)


YOUNG_TEMP_S = 60  # a temporary folder without a build lock this young may be a run's that is just starting


def remove_dead_temps(out: Path) -> list[Path]:
    """Remove the hidden `.NAME.*.tmp` folders beside `out` that killed runs of an atomic stage
    (prepare, export, eval) left: a build folder whose lock no live process holds (one without a
    lock, made by an earlier draftsmith, once it is a minute old), and an old output moved aside
    for a replacement once `out` is in place again. Returns those removed."""
    removed = []
    for p in sorted(out.parent.glob(f".{glob.escape(out.name)}.*.tmp")):
        if not p.is_dir() or p.is_symlink():
            continue
        dead = False
        if p.name.startswith(f".{out.name}.old."):
            dead = out.exists()  # the new output is in place: the old one was to be deleted
        elif (p / LOCK_FILE).exists():
            dead = lock_holder(p) is None
        else:
            with contextlib.suppress(OSError):
                dead = time.time() - p.stat().st_mtime > YOUNG_TEMP_S
        if dead:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
            print(f"removed {p}, left by a run that was killed", file=sys.stderr, flush=True)
    return removed


@contextlib.contextmanager
def output_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on an output folder while a stage writes into it: a second writer
    gets a UserError naming the holder's pid instead of mixing its files in.

    The lock is `flock` on `FOLDER/.draftsmith.lock`, which holds the owner's pid; the OS drops
    it when the process ends, however it ends. The folders this call created (`folder`, and those
    above it that were missing) are removed again when the stage leaves nothing else in them. An
    unwritable folder is a UserError too.
    """
    folder = Path(folder)
    created = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    path = folder / LOCK_FILE
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # the path, what the OS said and the fix (a file in the way, no permission, ...)
            raise from_os_error(e) from None
        if not _lock_exclusive(fd):
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UserError(
                f"{folder} is being written by another draftsmith process (pid {holder}); wait for it to "
                f"finish (`draftsmith status {folder}`) or stop it, or choose another --out"
            ) from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break  # locked the file that is in place (not one a finishing holder just removed)
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            if created and os.listdir(folder) == [LOCK_FILE]:  # nothing written: leave nothing behind
                os.unlink(path)
                for made in created:
                    os.rmdir(made)  # stops at the first that holds something else
        os.close(fd)


def _lock_exclusive(fd: int, tries: int = 20) -> bool:
    """flock LOCK_EX without waiting for another writer, but waiting out a `lock_holder` probe
    (a shared lock held for microseconds) for up to `tries` x 10 ms."""
    for _ in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.01)
    return False


def lock_holder(folder: Path) -> str | None:
    """The pid (as written, or "unknown" in the instant before it is) of the process holding
    `folder`'s output lock, or None when no process holds it. Probes with a shared lock, which
    never waits and which `output_lock` waits out."""
    try:
        fd = os.open(Path(folder) / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(fd, 32).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # closing drops the probe's shared lock
    return None


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield `(line_number, object)` for each non-blank line. Malformed JSON raises a
    UserError naming the file and line. A final line without a newline (a write cut short by a
    crash) is skipped only when it does not parse."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    with path.open("rb") as f:
        lines = f.read().split(b"\n")
    last = len(lines)
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            yield i, json_line(path, i, raw)
        except UserError:
            if i == last:  # torn trailing line from an interrupted append
                return
            raise


def json_line(path: Path, line: int, raw: bytes) -> Any:
    """One line of a JSONL file parsed, or a UserError naming the file and line: malformed JSON,
    or bytes that are not UTF-8 text (a binary file, another encoding)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}:{line}: not UTF-8 text (byte {e.start} of the line); give a JSON-lines file saved as UTF-8"
        ) from None
    except json.JSONDecodeError as e:
        raise UserError(
            f"{path}:{line}: malformed JSON ({e.msg} at column {e.colno}); fix or remove that line"
        ) from None
    except RecursionError:
        raise UserError(f"{path}:{line}: JSON nested too deeply to read; fix or remove that line") from None


SMALL_FILE = 1 << 20  # sampled_id hashes every byte of a file up to this size
SAMPLE, SAMPLE_SPAN, SAMPLES = 4 << 10, 2 << 20, (4, 64)  # and of a larger one, blocks of SAMPLE bytes spread
# over it, one per SAMPLE_SPAN within SAMPLES (a weight file of 128 MiB or more: 64)
SAMPLED_ID = "c3:"  # sampled_id's scheme: content ids recorded before issue 55
TENSOR_BLOCKS = 3  # content_id reads of each tensor of a safetensors file its first, middle and last SAMPLE bytes
WHOLE_FILE = 256 << 20  # and hashes every byte of any other file up to this size
CONTENT_ID = "c4:"  # the scheme of content_id: a recorded id without it was made otherwise, and is not compared


def tree_files(path: Path) -> list[Path]:
    """`path` itself, or the files of folder `path` in a stable order (hidden ones, such as a lock, left out)."""
    if not path.is_dir():
        return [path]
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )


def sampled_id(path: Path) -> str:
    """content_id as it was before issue 55 (scheme SAMPLED_ID): for a file over SMALL_FILE bytes
    its size and 4 to 64 blocks spread over it. Kept for the ids recorded with it (a target
    fingerprint's middle part, synth's resume keys); an edit between the blocks escapes it."""
    path = Path(path)
    h = hashlib.sha256()
    for f in tree_files(path):
        size = f.stat().st_size
        h.update(f"{f.relative_to(path) if f != path else ''}\0{size}\0".encode())
        with f.open("rb") as fh:
            if size <= SMALL_FILE:
                h.update(fh.read())
            else:
                n = min(max(size // SAMPLE_SPAN, SAMPLES[0]), SAMPLES[1])
                for i in range(n):
                    fh.seek((size - SAMPLE) * i // (n - 1))
                    h.update(fh.read(SAMPLE))
    return SAMPLED_ID + h.hexdigest()[:24]


def tensor_ranges(fh: Any, size: int) -> list[tuple[int, int]] | None:
    """The byte ranges [start, end) of a safetensors file's header and of each of its tensors, in
    file order, or None when the file is not safetensors (its header does not parse or fit)."""
    fh.seek(0)
    head = fh.read(8)
    n = int.from_bytes(head, "little") if len(head) == 8 else -1
    if not 0 < n <= min(size - 8, 100 << 20):
        return None
    try:
        header = json.loads(fh.read(n))
        spans = sorted(
            (8 + n + int(t["data_offsets"][0]), 8 + n + int(t["data_offsets"][1]))
            for k, t in header.items()
            if k != "__metadata__"
        )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    if any(not 8 + n <= a <= b <= size for a, b in spans):
        return None
    return [(0, 8 + n), *spans]


def hash_file(h: Any, f: Path, size: int) -> None:
    """Feed `h` content_id's view of file `f`: every byte up to SMALL_FILE; of a larger
    safetensors file (weights, a store's samples) its header and TENSOR_BLOCKS blocks of every
    tensor (a tensor of up to that many blocks whole), so that a layer a fine-tune changed is
    seen; of any other file every byte up to WHOLE_FILE, and of a larger one (a GGUF, a pickled
    checkpoint) SAMPLES[1] blocks spread over it."""
    with f.open("rb") as fh:
        ranges = tensor_ranges(fh, size) if size > SMALL_FILE else None
        fh.seek(0)
        if ranges is None and size <= WHOLE_FILE:
            while chunk := fh.read(8 << 20):
                h.update(chunk)
        elif ranges is None:
            for i in range(SAMPLES[1]):
                fh.seek((size - SAMPLE) * i // (SAMPLES[1] - 1))
                h.update(fh.read(SAMPLE))
        else:
            header, *tensors = ranges
            h.update(fh.read(header[1]))
            for a, b in tensors:
                if b - a <= TENSOR_BLOCKS * SAMPLE:
                    fh.seek(a)
                    h.update(fh.read(b - a))
                    continue
                for i in range(TENSOR_BLOCKS):
                    fh.seek(a + (b - a - SAMPLE) * i // (TENSOR_BLOCKS - 1))
                    h.update(fh.read(SAMPLE))


def content_id(path: Path) -> str:
    """An id of what a file or folder holds, the same for a copy (whatever its path or times)
    and changed by an edit: a hash of each file's name in the folder, its size and its content
    (`hash_file`: every tensor of a safetensors file sampled, any other file whole up to WHOLE_FILE)."""
    path = Path(path)
    h = hashlib.sha256()
    for f in tree_files(path):
        size = f.stat().st_size
        h.update(f"{f.relative_to(path) if f != path else ''}\0{size}\0".encode())
        hash_file(h, f, size)
    return CONTENT_ID + h.hexdigest()[:24]


def read_safetensors(path: Path, fix: str) -> dict[str, Any]:
    """The tensors of a safetensors file, or a UserError naming the file and `fix` when it is
    missing, truncated or not safetensors at all."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file; {fix}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable safetensors file ({e}); {fix}") from None


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding `path` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def safetensors_numel(path: Path) -> int | None:
    """How many elements the tensors of a safetensors file hold, from its header alone (nothing
    else is read), or None when it is not a readable safetensors file."""
    try:
        with Path(path).open("rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < n <= 100 << 20:
                return None
            header = json.loads(fh.read(n))
        return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def check_built_size(build: Any, weights: Path, what: str, fix: str) -> None:
    """Refuse, before a model is built for real, a config (a drafter.json) that describes far
    more elements than its weights file holds: `build()` runs on PyTorch's meta device, which
    allocates nothing, and its state's element count is compared with the file's header. A
    config edited to absurd sizes would otherwise allocate them (196 GB at once) before the load
    found the shapes wrong. A build that fails on the meta device is left to the real one."""
    import torch

    held = safetensors_numel(weights)
    if held is None:
        return  # missing or unreadable: the load names it
    try:
        with torch.device("meta"):
            model = build()
        need = sum(t.numel() for t in model.state_dict().values())
    except Exception:  # only a dry run: the real build reports its own errors
        return
    if need > 2 * held + (1 << 20):
        raise UserError(
            f"{what}: its config describes a model of {need:,} weights, and {weights} holds {held:,}: the sizes "
            f"in the config are not those of the weights (edited by hand?); {fix}"
        )
