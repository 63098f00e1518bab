"""The run report's training section: who trained the updates' micro-batches, and what the market
did while they trained."""
from __future__ import annotations

from roll_spotlight.run_report import _training_lines

ROW = {"train/micro_batches": 10.0, "train/micro_batches_trainer": 4.0, "train/micro_batches_spot": 3.0,
       "train/workers": 4.0, "train/spot_workers": 1.0, "train/reports_refused": 0.0, "train/spot_saved_s": 2.5}


def test_the_split_sums_every_update():
    text = "\n".join(_training_lines([dict(ROW), dict(ROW), {"reward_mean": 0.5}]))
    assert "2 updates, 20 micro-batches: 8 on the trainer, 6 on on-demand rollout workers, 6 on spot workers (30.0%" in text
    assert "spot workers were 25.0% of the workers that trained" in text
    assert "saved (their micro-batches at the on-demand rate): 5.0" in text


def test_preemptions_during_updates_are_counted_in_words():
    one = "\n".join(_training_lines([dict(ROW, **{"spot/preemptions_in_training": 1.0, "spot/notices_in_training": 0.0})]))
    assert "sent 0 notices and preempted 1 spot node;" in one
    two = "\n".join(_training_lines([dict(ROW, **{"spot/preemptions_in_training": 2.0, "spot/notices_in_training": 1.0})]))
    assert "sent 1 notice and preempted 2 spot nodes;" in two
    assert "preempted" not in "\n".join(_training_lines([dict(ROW)]))


def test_a_run_without_queue_training_has_no_section():
    assert _training_lines([{"reward_mean": 0.5}]) == []


def test_the_report_says_the_seed_and_where_timing_enters():
    from roll_spotlight.run_report import _variation_lines

    config = {"seed": 3, "exp_name": "mine", "pretrain": {"seed": 0}, "exploration": {"mode": "stale"},
              "spot": {"enabled": True, "compression": 30.0}}
    text = "\n".join(_variation_lines(config))
    assert "Seed 3 " in text and "pretrain.seed 0" in text
    assert "30x faster" in text and "Stale exploration" in text
    assert "Measured once" not in text  # the measured spread belongs to the quickstart's recipe only
    quiet = "\n".join(_variation_lines(dict(config, exploration={"mode": "off"}, spot={"enabled": False})))
    assert "Seed 3 " in quiet and "spot market" not in quiet and "Stale exploration" not in quiet


def test_the_quickstart_report_gives_the_measured_spread():
    from roll_spotlight.run_report import QUICKSTART_SPREAD, _variation_lines

    text = "\n".join(_variation_lines({"seed": 0, "exp_name": "quickstart", "pretrain": {"seed": 0}}))
    gains = QUICKSTART_SPREAD["gains"]
    assert len(gains) == len(QUICKSTART_SPREAD["seeds"]) >= 3
    assert f"spread {min(gains):+.3f} to {max(gains):+.3f}" in text and "configs/quickstart.yaml" in text
