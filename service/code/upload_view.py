"""What the CLI shows of a code upload: a rich progress bar of the files packed and the
bytes sent, for a directory large enough to take a while, and one line saying what
was sent (or that the server had the package already)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from api.code_upload import CodeUpload

LARGE_FILES = 200  # a bar from this many files on
LARGE_BYTES = 4 * 2**20  # or this many bytes to send


class UploadView:
    """The ``progress`` callback of ``Client.submit``; ``live=False`` shows no bar."""

    def __init__(self, console: Console, live: bool = True):
        self.console, self.live = console, live
        self.bar: Progress | None = None
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> "UploadView":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.live or total < (LARGE_FILES if phase == "files" else LARGE_BYTES):
            return
        if self.bar is None:
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[amount]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self.bar.start()
        if phase not in self.tasks:
            label = "packing code" if phase == "files" else "uploading code"
            self.tasks[phase] = self.bar.add_task(label, total=total, amount="")
        amount = f"{done}/{total} files" if phase == "files" else f"{done / 2**20:.1f}/{total / 2**20:.1f} MiB"
        self.bar.update(self.tasks[phase], completed=done, amount=amount)


def describe(upload: CodeUpload) -> str:
    """One line: the package, its size, and whether it was sent."""
    what = f"code {upload.ref[:19]}…: {upload.files} files, {upload.content_bytes / 1024:.1f} KiB"
    if upload.status == 200:
        what += ", already on the server (nothing uploaded)"
    else:
        what += f", uploaded {upload.sent_bytes / 1024:.1f} KiB"
    if upload.left_out:
        names = ", ".join(f"{p} ({n / 2**20:.1f} MiB)" for p, n in upload.left_out[:5])
        what += f"; data files left out for their size: {names}"
    return what
