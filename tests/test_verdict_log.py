"""The verdict log (``LABKIT_VERDICT_LOG``) and ``bench.verdicts``, which counts a run's uncalled big differences."""
from __future__ import annotations

import json

from bench import verdicts
from labkit.core import verdict


def test_every_compare_and_against_is_logged_and_counted(tmp_path, monkeypatch, capsys):
    log = tmp_path / "06.jsonl"
    monkeypatch.setenv(verdict.LOG_ENV, str(log))
    verdict.compare([1.0, 1.1, 1.2], [1.5, 1.6, 1.7])  # 0.69×: worse
    verdict.compare([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])  # 0.8×, ranges overlap: within noise (a big one, uncalled)
    verdict.compare([1.0], [1.5])  # one sample: no verdict (big, uncalled, one sample)
    verdict.against(1.0, [1.0, 1.01, 0.99])
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["how"] for r in rows] == ["compare"] * 3 + ["against"]
    out = verdicts.main([str(log)])
    got = out["per_file"]["06"]
    assert got["verdicts"] == 4 and got["big"] == 3
    assert got["big_uncalled"] == 2 and got["big_uncalled_two_plus"] == 1 and got["called_under_floor"] == 0
    assert json.loads(capsys.readouterr().out) == out


def test_nothing_is_logged_without_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv(verdict.LOG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    verdict.compare([1.0, 1.1, 1.2], [1.5, 1.6, 1.7])
    assert list(tmp_path.iterdir()) == []
