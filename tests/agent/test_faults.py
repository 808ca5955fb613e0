"""Faults on one machine lose nothing: two writers on one run directory, a crash that cut the metrics
file, the disk filling during a checkpoint save (overflowing rewards: tests/credit/test_contract.py)."""

import errno
import json
import shutil
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath

from bepo_jax.agent.rl.checkpoint import CheckpointError, Checkpointer
from bepo_jax.agent.train import RunConfig, read_metrics, train
from bepo_jax.agent.train.rundir import RunLock


def _tiny(**kw):
    return RunConfig(iterations=2, groups=2, group_size=2, max_steps=3, width=16, heads=2, eval_tasks=2, eval_every=2,
                     checkpoint_every=1, task_pool=4, **kw)


HOLD = ("import sys, time; from bepo_jax.agent.train.rundir import RunLock\n"
        "with RunLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)\n")


def test_a_second_writer_is_refused_and_a_killed_one_releases_the_lock(tmp_path):
    run = tmp_path / "run"
    with RunLock(run):
        with pytest.raises(ValueError, match="being written by another run"):
            with RunLock(run):
                pass
    with RunLock(run):  # released on exit
        pass
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=f'"pid": {holder.pid}'):  # the refusal names the holder
            train(_tiny(), run, progress=False)
        assert not (run / "config.json").exists()  # refused before writing anything
    finally:
        holder.kill()  # SIGKILL: no cleanup runs in the holder
        holder.wait()
    t0 = time.monotonic()
    train(_tiny(), run, progress=False)  # the operating system released the dead holder's lock
    assert time.monotonic() - t0 < 300 and [r["iteration"] for r in read_metrics(run)] == [0, 1, 2]


@pytest.mark.slow  # long (tens of seconds on 2 cores): make test skips it, CI=1 runs it
def test_resume_drops_a_metrics_line_cut_by_a_crash_and_says_so(tmp_path):
    run = tmp_path / "run"
    train(_tiny(), run, progress=False)
    whole = read_metrics(run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    # a crash in iteration 2's write: its line cut in the middle (checkpoint 2 was never written)
    (run / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])
    shutil.rmtree(run / "checkpoints" / "2")
    with pytest.warns(RuntimeWarning, match=r"line 3 of 3 is cut .* rows up to iteration 1 are kept"):
        train(_tiny(), run, resume=True, progress=False)
    again = read_metrics(run)
    assert [r["iteration"] for r in again] == [0, 1, 2]
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["iteration"] == 2  # rewritten whole
    for a, b in zip(whole, again):
        assert a["success_rate"] == b["success_rate"]  # the resumed run is the uninterrupted one


# orbax's background writer thread dies with the simulated error after the manager closed its event loop
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_full_disk_during_a_checkpoint_save_is_a_clear_error_and_the_previous_one_restores(tmp_path, monkeypatch):
    ck = Checkpointer(tmp_path / "ck")
    ck.save(1, {"w": jnp.ones(3)}, {"iteration": 1})

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:  # orbax writes its metadata through etils.epath
        m.setattr(epath.Path, "write_text", full)
        m.setattr(epath.Path, "write_bytes", full)
        with pytest.raises(CheckpointError, match=r"saving checkpoint 2 .*\(the disk is full.*\[1\] are intact"):
            ck.save(2, {"w": 2 * jnp.ones(3)}, {"iteration": 2})
    assert ck.steps() == [1]
    assert not list((tmp_path / "ck").glob("2*"))  # no partial directory left behind
    state, meta, step = ck.restore_latest({"w": jnp.zeros(3)})
    assert step == 1 and meta == {"iteration": 1} and np.allclose(state["w"], 1.0)
    ck.save(3, {"w": 3 * jnp.ones(3)}, {"iteration": 3})  # and the checkpointer keeps working
    assert ck.steps() == [1, 3]


def test_an_atomic_write_that_fails_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    import os as _os

    from bepo_jax.agent.train.rundir import atomic_write

    path = tmp_path / "summary.json"
    atomic_write(path, "old")
    real = _os.replace

    def crash(src, dst):  # the writer dies between the write and the rename
        raise OSError("killed")

    monkeypatch.setattr(_os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        atomic_write(path, "new")
    monkeypatch.setattr(_os, "replace", real)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    # two writers of one file each write through a temporary of their own
    import threading

    threads = [threading.Thread(target=atomic_write, args=(path, str(i) * 1000)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = path.read_text()
    assert len(text) == 1000 and len(set(text)) == 1 and [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_host_files_saving_a_step_again_keeps_the_old_copy_until_the_new_one_is_in_place(tmp_path, monkeypatch):
    import os as _os

    from bepo_jax.agent.rl.checkpoint import HostFiles

    hf = HostFiles(tmp_path)
    state = {"w": np.arange(4.0)}
    hf.save(3, state, {"iteration": 3}, keep=2)
    real = _os.replace
    seen = []

    def dies_on_the_final_rename(src, dst):
        seen.append((str(src), str(dst)))
        if str(src).endswith(f".tmp-{_os.getpid()}"):
            raise OSError("killed")
        return real(src, dst)

    monkeypatch.setattr(_os, "replace", dies_on_the_final_rename)
    with pytest.raises(OSError, match="killed"):
        hf.save(3, {"w": np.zeros(4)}, {"iteration": 3}, keep=2)
    monkeypatch.setattr(_os, "replace", real)
    # the old copy was moved aside, not deleted, and the next look at the steps puts it back
    aside = tmp_path / f"3.old-{_os.getpid()}"
    assert aside.exists() and not (tmp_path / "3").exists()
    assert hf.steps() == [3] and not aside.exists()
    assert hf.restore(3, {"w": np.zeros(4)})[0]["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    hf.save(3, {"w": np.ones(4)}, {"iteration": 3}, keep=2)  # saving again completes and tidies
    got, meta = hf.restore(3, {"w": np.zeros(4)})
    assert got["w"].tolist() == [1.0] * 4 and hf.steps() == [3] and sorted(p.name for p in tmp_path.iterdir()) == ["3"]
