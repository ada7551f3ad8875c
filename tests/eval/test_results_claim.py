"""Results directories written before their claim went through :mod:`astra_agent.claim` still
resume: ``config.json`` byte for byte as ``astra-eval`` wrote it then (captured from it), with
and without the eval's kind."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from astra_agent.errors import ConfigError
from eval.results import CONFIG, RESULTS, EvalRecord, RunMeta, prepare_results_dir

CONFIG_TEXT = """{
  "format": 2,
  "kind": "arenas",
  "fingerprint": {
    "model": "astra",
    "temperature": 0.6,
    "data": "é"
  },
  "base_url": "http://127.0.0.1:8000/v1"
}"""
NO_KIND_TEXT = CONFIG_TEXT.replace('  "kind": "arenas",\n', "")


def meta(kind: str | None = "arenas", **fingerprint: object) -> RunMeta:
    fp = {"model": "astra", "temperature": 0.6, "data": "é", **fingerprint}
    return RunMeta(kind=kind, fingerprint=fp, base_url="http://127.0.0.1:8000/v1")


@pytest.mark.parametrize(("text", "kind"), [(CONFIG_TEXT, "arenas"), (NO_KIND_TEXT, None)])
def test_results_of_then_resume_and_config_json_is_written_as_then(
    tmp_path: Path, text: str, kind: str | None
) -> None:
    (tmp_path / CONFIG).write_text(text, encoding="utf-8")
    (tmp_path / RESULTS).write_text('{"id": "e0"}\n')
    assert list(prepare_results_dir(tmp_path, meta(kind), True, EvalRecord)) == ["e0"]
    assert (tmp_path / CONFIG).read_text(encoding="utf-8") == text
    with pytest.raises(ConfigError, match=r"different configuration \(data, temperature differ\)"):
        prepare_results_dir(tmp_path, meta(kind, temperature=0.1, data=2), True, EvalRecord)
    with pytest.raises(ConfigError, match="already holds results"):
        prepare_results_dir(tmp_path, meta(kind), False, EvalRecord)


def test_another_endpoint_resumes_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / CONFIG).write_text(CONFIG_TEXT, encoding="utf-8")
    (tmp_path / RESULTS).write_text('{"id": "e0"}\n')
    moved = meta().model_copy(update={"base_url": "http://localhost:9/v1"})
    with caplog.at_level(logging.WARNING):
        assert list(prepare_results_dir(tmp_path, moved, True, EvalRecord)) == ["e0"]
    assert "was run against http://127.0.0.1:8000/v1; resuming against http://localhost:9/v1" in (
        caplog.text
    )


def test_a_fresh_directory_gets_config_json_as_then(tmp_path: Path) -> None:
    assert prepare_results_dir(tmp_path / "out", meta(), False, EvalRecord) == {}
    assert (tmp_path / "out" / CONFIG).read_text(encoding="utf-8") == CONFIG_TEXT
