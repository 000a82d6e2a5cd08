"""What an elastic job reads and reports: its size, a learning rate for its batch, samples/s."""

from __future__ import annotations

import itertools
import json
import os
import signal
import time

import pytest

import fleet_worker as fw
from fleet_worker import signals


def test_the_size_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_BATCH_SIZE", raising=False)
    assert fw.batch_size() is None and fw.batch_size(256) == 256
    monkeypatch.setenv("FLEET_BATCH_SIZE", "726")
    monkeypatch.setenv("FLEET_NUM_GPUS", "2")
    assert (fw.batch_size(256), fw.num_gpus()) == (726, 2)


def test_the_learning_rate_scales_with_the_batch() -> None:
    assert fw.scale_lr(0.1, base_batch=256, batch=512) == pytest.approx(0.2)
    assert fw.scale_lr(0.1, base_batch=256, batch=64) == pytest.approx(0.025)
    assert fw.scale_lr(0.1, base_batch=256, batch=1024, rule="sqrt") == pytest.approx(0.2)
    with pytest.raises(ValueError, match="rule 'cubic'"):
        fw.scale_lr(0.1, 256, 512, rule="cubic")


@pytest.mark.parametrize(("batch", "world"), [(725, 1), (726, 4), (1023, 3), (5, 8)])
def test_a_global_batch_splits_over_the_workers_without_gaps_or_overlaps(batch: int, world: int) -> None:
    shards = [fw.elastic.shard(batch, world, rank) for rank in range(world)]
    assert shards[0][0] == 0 and shards[-1][1] == batch
    assert all(a[1] == b[0] for a, b in itertools.pairwise(shards))
    assert max(b - a for a, b in shards) - min(b - a for a, b in shards) <= 1


def test_report_prints_a_progress_line_with_samples_per_second(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLEET_NUM_GPUS", "2")
    monkeypatch.setenv("FLEET_BATCH_SIZE", "512")
    monkeypatch.setattr(signals, "_reported", signals._Throughput())
    # the first report of a process: start-up came before it, not training, so no rate
    assert fw.report(samples=5120, step=40, loss=0.5) == 0.0
    first = json.loads(capsys.readouterr().out.strip().split(" ", 1)[1])
    assert "samples_per_s" not in first and (first["step"], first["num_gpus"]) == (40, 2)
    time.sleep(0.05)
    rate = fw.report(samples=5120, step=80, loss=0.5)
    line = capsys.readouterr().out.strip()
    assert line.startswith("fleet-progress ")
    fields = json.loads(line.split(" ", 1)[1])
    assert (fields["step"], fields["loss"], fields["num_gpus"], fields["batch_size"]) == (80, 0.5, 2, 512)
    assert fields["samples_per_s"] == pytest.approx(rate, rel=1e-3) and 0 < rate <= 5120 / 0.05


def test_a_second_sigterm_while_the_first_sets_the_stop_flag_does_not_hang_the_job() -> None:
    # Given the SIGTERM handler, and the stop flag's lock held as while a first SIGTERM's handler sets it
    previous = signal.getsignal(signal.SIGTERM)
    stop = fw.stop_requested()
    stop.clear()
    try:
        with stop._cond:  # type: ignore[attr-defined]
            # When a second SIGTERM comes (a launcher forwarding the one its process group got): its
            # handler runs in this very thread, which holds the lock
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        # Then it returned at once, and the flag is set as soon as the lock is free
        assert stop.wait(timeout=5)
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop.clear()
