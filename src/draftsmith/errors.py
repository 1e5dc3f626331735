"""User-facing errors.

Raise `UserError` for anything the user can fix (bad input, missing files, wrong flags). The
CLI prints its message without a traceback and exits non-zero. Messages say what was wrong,
where (file, line, sample) and what to do.
"""


class UserError(Exception):
    """An error caused by input the user controls. `exit_code` is what the CLI returns."""

    exit_code = 2


class StageFailed(UserError):
    """A stage stopped on purpose (error budget, disk full); valid output was kept."""

    exit_code = 4
