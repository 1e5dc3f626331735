"""User-facing errors.

Raise `UserError` for anything the user can fix (bad input, missing files, wrong flags). The
CLI prints its message without a traceback and exits non-zero. Messages say what was wrong,
where (file, line, sample) and what to do.

An `OSError` that reaches the CLI (an unwritable or impossible `--out`, a folder where a file
belongs, a full disk) is reported the same way: `from_os_error` names the path and the fix.
"""

from __future__ import annotations

import errno


class UserError(Exception):
    """An error caused by input the user controls. `exit_code` is what the CLI returns."""

    exit_code = 2


class StageFailed(UserError):
    """A stage stopped on purpose (error budget, disk full); valid output was kept."""

    exit_code = 4


# errno -> what to do about it
_FIXES = {
    errno.EACCES: "not writable here: choose another --out or fix its permissions",
    errno.EPERM: "not writable here: choose another --out or fix its permissions",
    errno.EROFS: "on a read-only filesystem: choose another --out",
    errno.ENOTDIR: "a part of this path is a file, not a folder: choose another path",
    errno.EEXIST: "exists and is not a folder: choose another path",
    errno.EISDIR: "is a folder: give a file path",
    errno.ENOENT: "check the path",
    errno.ENAMETOOLONG: "the name is too long: choose a shorter path",
}


RESUME = "what was written is kept; rerun the same command to resume"


def from_os_error(e: OSError, outcome: str = RESUME) -> UserError:
    """The UserError for an OSError: the path, what the OS said and the fix. A full disk or a
    file-size limit is a StageFailed (exit 4) that says what to free and `outcome`: what became of
    the output and how to go on (by default: what was written is kept, and the same command
    resumes)."""
    where = f"{e.filename}: " if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return StageFailed(
            f"{where}disk full ({e.strerror}); free some space on that filesystem (or choose an --out on "
            f"another one); {outcome}"
        )
    if e.errno == errno.EFBIG:  # the file-size limit (`ulimit -f`) or the filesystem's largest file
        return StageFailed(
            f"{where}{e.strerror or 'File too large'} (over the process's file-size limit, `ulimit -f`, or "
            f"the filesystem's largest file); raise the limit or choose an --out on another filesystem; {outcome}"
        )
    fix = _FIXES.get(e.errno or 0, "check the path and its filesystem")
    return UserError(f"{where}{e.strerror or e}; {fix}")


def naming(e: OSError, path: object) -> OSError:
    """`e` naming `path` where the OS named no file (a failed write() names none)."""
    return e if e.filename else OSError(e.errno, e.strerror or str(e), str(path))
