"""The set-up the GPU benchmarks time (``flows.gpu.profile_evaluation``: benchmarks/gpu_eval.py,
benchmarks/decode_probe.py) is the job's evaluation: the profile's ``evaluate`` section with the
overrides merged in, ``from_data`` resolved from the profile's SFT rows, the same episodes as
:func:`flows.gpu.evaluate` plays; and the job's last stage, ``unbatched_check``, compares greedy
transcripts played one dialogue at a time with the batched ones."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from catalog.io import read_params
from pipelines.errors import ConfigError


def _gpu_params(sft_rows) -> dict:
    gpu = read_params("gpu")
    gpu["profiles"]["speakrl"]["sft"]["data"]["sources"] = [{"path": str(sft_rows)}]
    return gpu


@pytest.fixture()
def sft_rows(tmp_path):
    path = tmp_path / "speaker_sft.parquet"
    pq.write_table(pa.table({"prompt": ["hi", "book it"], "completion": ["<think>ok</think> Sure.", "One moment " * 6]}), path)
    return path


def test_the_benchmarks_play_the_jobs_evaluation(small_corpus_dir, tiny_model_dir, sft_rows, tmp_path, single_torch_thread):
    from flows.gpu import (data_generation_limit, deep_merge, evaluate, play_timed, profile_evaluation, profile_params, resolve_attention,
                           with_limit)

    gpu = _gpu_params(sft_rows)
    overrides = {"source": str(small_corpus_dir), "max_goals": 2, "max_exchanges": 2, "seeds": [0], "workers": 1,
                 "generation": {"batch_size": 4, "threads": 1, "dtype": "float32", "cuda_graphs": False},
                 "stats": {"resamples": 100}}
    setting = profile_evaluation(gpu, tiny_model_dir, "speakrl", overrides, "test evaluate")
    _, sections = profile_params(gpu, "speakrl", smoke=False)
    limit = data_generation_limit(sections, tiny_model_dir)["tokens"]
    assert sections["evaluate"]["generation"]["max_new_tokens"] == "from_data"
    assert setting.config.generation.max_new_tokens == limit >= 32  # from the SFT rows, not a default
    assert setting.config.max_goals == 2 and len(setting.goals) == 2 and setting.config.max_exchanges == 2
    assert setting.config.prompt.max_prompt_tokens == sections["evaluate"]["prompt"]["max_prompt_tokens"]  # the rest is the profile's
    # the profile's attention is auto: the set-up takes the one its timing picked, as the job does
    assert sections["evaluate"]["continuous"] == {"attention": "auto", "draft": {"tokens": 4, "ngram": 3}}
    assert setting.continuous == setting.attention_timing["chosen"] in setting.attention_timing["ms_per_step"]
    assert setting.draft == (4, 3)  # its batched steps verify prompt-lookup drafts

    played, wall_s, _ = play_timed(setting.agent, setting.goals, setting.simulator, setting.database, setting.config.plan())
    assert len(played) == 2 and wall_s > 0
    out = tmp_path / "job"
    out.mkdir()
    section, _ = resolve_attention(with_limit(deep_merge(sections["evaluate"], overrides), limit), tiny_model_dir, "test evaluate",
                                   setting.attention_timing)
    evaluate(section, {"model": str(tiny_model_dir)}, out)
    events: dict = {}
    for row in pq.read_table(out / "episode_events.parquet").to_pylist():
        events.setdefault(row["episode_id"], []).append((row["event_index"], row["actor"], row["text"]))
    assert len(events) == len(played)
    for episode in played:
        table = [(actor, text) for _, actor, text in sorted(events[episode.episode_id])]
        assert table == [(event.actor, event.text) for event in episode.events]
        assert any(actor == "agent" and text for actor, text in table)  # the model spoke

def test_a_split_without_goals_is_named(small_corpus_dir, tiny_model_dir, sft_rows):
    from flows.gpu import profile_evaluation

    with pytest.raises(ConfigError, match="bench evaluate: no dialogues of split 'nowhere'"):
        profile_evaluation(_gpu_params(sft_rows), tiny_model_dir, "speakrl",
                           {"source": str(small_corpus_dir), "split": "nowhere"}, "bench evaluate")


def _section(corpus) -> dict:
    return {
        "source": str(corpus), "split": "test", "max_goals": 3, "seeds": [0], "max_exchanges": 3,
        "simulator": {"kind": "agenda"}, "generation": {"temperature": 0.0, "max_new_tokens": 12, "batch_size": 8, "threads": 1},
        "stats": {"resamples": 100}, "workers": 1,
    }


def test_the_unbatched_check_compares_greedy_transcripts_and_names_the_first_difference(small_corpus_dir, tiny_model_dir, tmp_path,
                                                                                      single_torch_thread):
    import dataclasses

    from flows.gpu import evaluate, unbatched_check

    section, played = _section(small_corpus_dir), {}
    evaluate(section, {"tiny": str(tiny_model_dir)}, tmp_path, played)
    report = unbatched_check(section, 2, {"tiny": str(tiny_model_dir)}, played)
    row = report["models"]["tiny"]["float32"]
    assert (report["goals"], report["dtype"], row["dialogues"], row["identical"], row["differences"]) == (2, "float32", 2, 2, [])
    assert row["batched"]["by"] == "the evaluation" and row["batched"]["episodes"] == 3
    assert row["batched"]["dialogues_per_s"] == played["tiny"][2]["dialogues_per_s"] and "| tiny | float32 | the evaluation |" in report["markdown"]
    # Another dtype: the evaluation's goals batched by the check itself, its speed and verdicts beside.
    report = unbatched_check(section, 1, {"tiny": str(tiny_model_dir)}, played, ["float32", "bfloat16"])
    assert list(report["models"]["tiny"]) == ["float32", "bfloat16"]
    row = report["models"]["tiny"]["bfloat16"]
    assert row["batched"]["by"] == "this check" and row["batched"]["episodes"] == 3 and row["batched"]["dialogues_per_s"] > 0
    assert row["dialogues"] == 1 and row["identical"] + len(row["differences"]) == 1
    assert sorted(row["batched"]["successes"]) == sorted(e.episode_id for e in played["tiny"][0])
    assert 0 <= report["success_changed_between_dtypes"]["tiny"] <= 3 and "success verdict differs" in report["markdown"]

    # A batched run that said something else at one agent turn: found, at that utterance.
    episodes, *rest = played["tiny"]
    first = episodes[0]
    spoken = [i for i, event in enumerate(first.events) if event.is_utterance and event.actor == "agent"]
    events = list(first.events)
    events[spoken[0]] = dataclasses.replace(events[spoken[0]], text="something else")
    altered = {"tiny": ([dataclasses.replace(first, events=tuple(events)), *episodes[1:]], *rest)}
    report = unbatched_check(section, 2, {"tiny": str(tiny_model_dir)}, altered)
    row = report["models"]["tiny"]["float32"]
    assert row["identical"] == 1 and len(row["differences"]) == 1
    difference = row["differences"][0]
    utterances = [i for i, event in enumerate(first.events) if event.is_utterance]
    assert difference["episode_id"] == first.episode_id and difference["utterance"] == utterances.index(spoken[0])
    assert difference["batched"] == "something else" and difference["one_at_a_time"] == first.events[spoken[0]].text[:240]
    assert "something else" in report["markdown"]


def test_the_unbatched_check_refuses_what_it_cannot_compare(small_corpus_dir, tiny_model_dir):
    from flows.gpu import unbatched_check, unbatched_check_params

    with pytest.raises(ConfigError, match=r"\['tiny'\] not played"):
        unbatched_check(_section(small_corpus_dir), 1, {"tiny": str(tiny_model_dir)}, {})
    sampled = {**_section(small_corpus_dir), "generation": {"temperature": 0.7, "max_new_tokens": 12}}
    with pytest.raises(ConfigError, match="samples"):
        unbatched_check(sampled, 1, {"tiny": str(tiny_model_dir)}, {"tiny": ([], None, None)})
    for bad, field in (({"goals": 0}, "goals"), ({"goals": 2, "models": []}, "models"), ({"goals": 2, "extra": 1}, "unbatched_check"),
                       ({"goals": 2, "dtypes": ["float16"]}, "dtypes")):
        with pytest.raises(ConfigError, match=f"w.unbatched_check.*{field}|w.{field}"):
            unbatched_check_params(bad, ["zero_shot", "sft"], "w")


def test_the_unbatched_check_names_goals_the_evaluation_did_not_play(small_corpus_dir, tiny_model_dir, tmp_path, single_torch_thread):
    from flows.gpu import evaluate, unbatched_check

    section, played = {**_section(small_corpus_dir), "max_goals": 1, "max_exchanges": 1}, {}
    evaluate(section, {"tiny": str(tiny_model_dir)}, tmp_path, played)
    with pytest.raises(ConfigError, match=r"unbatched_check.goals: 2 goals to play one at a time, but the evaluation played 1"):
        unbatched_check(section, 2, {"tiny": str(tiny_model_dir)}, played)
