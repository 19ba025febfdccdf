"""The warm-up's early boost (--early-epochs, --early-boost): the first K epochs teach other targets."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.embedded import smollm2_path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    from training.tiny_policy import build_tiny_policy

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "init", tokenizer, hidden=8, layers=1, heads=2)


def _recording_loss(monkeypatch):
    """warmup.decision_loss replaced by one that records each batch's demonstrations (and still
    back-propagates through the model, so the optimizer steps as in a run)."""
    from training.quickstart import warmup

    batches: list[list] = []

    def decision_loss(model, demos, pad_id, **kw):
        batches.append(list(demos))
        return sum(p.sum() for p in model.parameters()) * 0.0

    monkeypatch.setattr(warmup, "decision_loss", decision_loss)
    return batches


def test_the_first_k_epochs_teach_the_early_demonstrations_and_the_rest_the_own(monkeypatch, tmp_path, tiny):
    from training.quickstart.warmup import supervised_warmup

    batches = _recording_loss(monkeypatch)
    own, early = ["own-1", "own-2", "own-3"], ["early-1", "early-2", "early-3"]
    out = supervised_warmup(tiny, tmp_path / "warm", own, epochs=3, lr=1e-3, batch_size=2, seed=0,
                            early=(early, 2), log=lambda *_: None)
    epochs = [sorted(batches[0] + batches[1]), sorted(batches[2] + batches[3]), sorted(batches[4] + batches[5])]
    assert epochs == [early, early, own]                   # two batches of <= 2 per epoch, each turn once
    assert (out / "config.json").exists()


def test_without_an_early_phase_every_epoch_teaches_the_own_demonstrations(monkeypatch, tmp_path, tiny):
    from training.quickstart.warmup import supervised_warmup

    batches = _recording_loss(monkeypatch)
    supervised_warmup(tiny, tmp_path / "warm", ["a", "b"], epochs=2, lr=1e-3, batch_size=2, seed=0,
                      log=lambda *_: None)
    assert [sorted(b) for b in batches] == [["a", "b"], ["a", "b"]]


def test_early_demonstrations_of_other_turns_are_refused(monkeypatch, tmp_path, tiny):
    from training.quickstart.warmup import supervised_warmup

    _recording_loss(monkeypatch)
    with pytest.raises(ValueError, match="early demonstrations: 1 turns, expected the 2 of demos"):
        supervised_warmup(tiny, tmp_path / "warm", ["a", "b"], epochs=2, lr=1e-3, batch_size=2, seed=0,
                          early=(["a"], 1), log=lambda *_: None)


def test_warm_up_hands_every_try_the_early_boosted_demonstrations(monkeypatch, tmp_path):
    """run.warm_up: with --early-epochs K each try gets (demos boosted by --early-boost, K) as `early`
    and its own boost's demos after; K = 0 passes none."""
    from training import tiny_policy
    from training.quickstart import reading, run, warmup

    early_seen, taught = [], []
    monkeypatch.setattr(tiny_policy, "build_tiny_policy", lambda out, tok, seed, **kw: out)
    monkeypatch.setattr(warmup, "with_favoured_boost", lambda demos, tok, boost: [(boost, d) for d in demos])

    def supervised_warmup(init, out, demos, *, early=None, **kw):
        taught.append(demos)
        early_seen.append(early)
        out.mkdir(parents=True)
        return out

    monkeypatch.setattr(warmup, "supervised_warmup", supervised_warmup)
    readings = iter([{"favour": 0.45, "cost": 0.45, "accuracy": 0.44}, {"favour": 0.6, "cost": 0.2, "accuracy": 0.2}])
    monkeypatch.setattr(reading, "favour_reading", lambda *a, **k: next(readings))
    monkeypatch.setattr(run, "taught_distribution", lambda demos, tok: {})
    cfg = SimpleNamespace(run=SimpleNamespace(seed=3, device="cpu"), rollout=SimpleNamespace(context_tokens=2048))
    runtime = SimpleNamespace(qa=SimpleNamespace(retrieval=SimpleNamespace(topk=1)))
    args = SimpleNamespace(policy="tiny", warmup_tries=3, favour_boost=0.5, retry_favour_boost=0.65, hidden=8,
                           layers=1, local_window=0, warmup_epochs=24, warmup_lr=1e-3, warmup_batch=2,
                           alias_weight=1.0, favour_weight=1.0, warmup_separation=0.25, warmup_validation=False,
                           embeddings="random", unread_words=0, early_epochs=12, early_boost=0.8,
                           alias_prior="pooled", tool_spread=0.3)
    run.warm_up(tmp_path, cfg, runtime, ["d1", "d2"], [], None, args)
    assert taught == [[(0.5, "d1"), (0.5, "d2")], [(0.65, "d1"), (0.65, "d2")]]
    assert early_seen == [([(0.8, "d1"), (0.8, "d2")], 12)] * 2

    early_seen.clear()
    readings = iter([{"favour": 0.6, "cost": 0.2, "accuracy": 0.2}])
    args.early_epochs = 0
    run.warm_up(tmp_path / "off", cfg, runtime, ["d1"], [], None, args)
    assert early_seen == [None]


def test_early_flags_out_of_range_get_one_line_naming_the_flag(capsys):
    from training.quickstart.cli import _args as args

    for argv, flag in ((["--early-epochs", "25"], "--early-epochs 25"), (["--early-epochs", "-1"], "--early-epochs -1"),
                       (["--early-epochs", "4", "--early-boost", "1.2"], "--early-boost 1.2")):
        with pytest.raises(SystemExit):
            args(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag in err[0]
