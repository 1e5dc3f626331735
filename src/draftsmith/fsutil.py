"""Small filesystem helpers: atomic files and folders, JSONL reading with line numbers.

Every file a stage publishes goes through these, so that a crash at any instant leaves either
the old content or the complete new content, never a partial file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftsmith.errors import UserError, from_os_error


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
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output_dir(out: Path, overwrite: bool = False) -> Iterator[Path]:
    """Build a whole output folder under a temporary name, then rename it into place.

    Refuses an existing `out` unless `overwrite`, before and again at the rename: an `out` that
    another run put there meanwhile is kept and this run's folder discarded, with an error. On
    any error the temporary folder is removed and nothing is left at `out`.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise UserError(f"output folder {out} already exists; pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
    try:
        yield tmp
        if out.exists() and not overwrite:
            raise UserError(f"{out} appeared while this run was writing (another run with the same --out?): it is "
                            "kept and this run's output discarded; rerun with another --out, or --overwrite to replace it")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


LOCK_FILE = ".draftsmith.lock"


@contextlib.contextmanager
def output_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on an output folder while a stage writes into it: a second writer
    gets a UserError naming the holder's pid instead of mixing its files in.

    The lock is `flock` on `FOLDER/.draftsmith.lock`, which holds the owner's pid; the OS drops
    it when the process ends, however it ends. A folder this call created is removed again when
    the stage leaves nothing else in it. An unwritable folder is a UserError too.
    """
    folder = Path(folder)
    created, path = not folder.exists(), folder / LOCK_FILE
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # the path, what the OS said and the fix (a file in the way, no permission, ...)
            raise from_os_error(e) from None
        if not _lock_exclusive(fd):
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UserError(f"{folder} is being written by another draftsmith process (pid {holder}); wait for it to "
                            f"finish (`draftsmith status {folder}`) or stop it, or choose another --out") from None
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
                os.rmdir(folder)
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
        raise UserError(f"{path}:{line}: not UTF-8 text (byte {e.start} of the line); give a JSON-lines file "
                        "saved as UTF-8") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{line}: malformed JSON ({e.msg} at column {e.colno}); fix or remove that line") from None


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
