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


def from_os_error(e: OSError) -> UserError:
    """The UserError for an OSError: the path, what the OS said and the fix. A full disk is a
    StageFailed: what was written is kept, and the same command resumes once space is freed."""
    where = f"{e.filename}: " if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return StageFailed(f"{where}disk full ({e.strerror}); what was written is kept: free some space and "
                           "rerun the same command to resume")
    fix = _FIXES.get(e.errno or 0, "check the path and its filesystem")
    return UserError(f"{where}{e.strerror or e}; {fix}")
