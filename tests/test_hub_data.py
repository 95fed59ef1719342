"""Built-in dataset names without a local copy read their hub copy: which repository, config and splits, and the
rows as the hub holds them (made up here: no network in tests)."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from dgrpo.data import loaders
from dgrpo.data.records import DataError

HUB_ROWS = {
    ("openai/gsm8k", "main", "test"): [{"question": "Tom has 3 and 4. Total?", "answer": "3+4=<<3+4=7>>7\n#### 7"}],
    ("whynlp/gsm8k-aug", None, "validation"): [{"question": "q", "cot": "<<3+4=7>> <<7*2=14>>", "answer": "14"}],
    ("ChilleD/SVAMP", None, "train"): [{"ID": "a", "Body": "5 birds.", "Question": "Legs?", "Answer": 10.0}],
    ("ChilleD/SVAMP", None, "test"): [{"ID": "b", "Body": "2 cats.", "Question": "Legs?", "Answer": 8.0}],
    ("ChilleD/MultiArith", None, "train"): [{"question": "2 plus 2?", "final_ans": "4"}],
    ("ChilleD/MultiArith", None, "test"): [{"question": "3 times 3?", "final_ans": 9}],
    ("reasoning-machines/gsm-hard", None, "train"): [{"input": "1.5 * 2?", "code": "...", "target": 3.0}],
}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """No local data folder; a reachable hub whose ``load_dataset`` serves HUB_ROWS and records each call."""
    calls: list[tuple] = []

    def load_dataset(repo, config=None, split=None):
        calls.append((repo, config, split))
        if repo == "openai/gsm8k" and config is None:  # as the hub answers for a dataset with several configs
            raise ValueError(
                "Config name is missing.\nPlease pick one among the available configs: ['main', 'socratic']"
            )
        if (repo, config, split) not in HUB_ROWS:  # (datasets' words)
            splits = [s for r, c, s in HUB_ROWS if (r, c) == (repo, config)]
            raise ValueError(f'Unknown split "{split}". Should be one of {splits}.')
        return HUB_ROWS[(repo, config, split)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(loaders, "hub_reachable", lambda: True)
    monkeypatch.delenv("DGRPO_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./data
    return calls


def test_builtin_names_read_their_hub_copy_without_a_local_one(hub):
    gsm = loaders.load_dataset("gsm8k", "test")
    assert hub == [("openai/gsm8k", "main", "test")] and [r.answer for r in gsm] == ["7"]
    assert gsm[0].meta["source"] == "hf:openai/gsm8k"
    aug = loaders.load_dataset("gsm8k_aug", "valid")  # our split name, the hub's 'validation'
    assert aug[0].steps == ["<<3+4=7>>", "<<7*2=14>>"] and aug[0].answer == "14"
    svamp = loaders.load_dataset("svamp")  # all 1000 problems: the hub's train and test, joined
    assert [(r.question, r.answer) for r in svamp] == [("5 birds. Legs?", "10"), ("2 cats. Legs?", "8")]
    assert [r.answer for r in loaders.load_dataset("multiarith")] == ["4", "9"]
    assert loaders.load_dataset("gsm_hard")[0].answer == "3"
    with pytest.raises(DataError, match=r"^dataset 'prosqa': no local copy \(set DGRPO_DATA_DIR"):
        loaders.load_dataset("prosqa")  # no hub copy: the local folder is the only way


def test_a_local_copy_wins_and_an_unreachable_hub_is_one_line(hub, monkeypatch, tmp_path):
    data = tmp_path / "data"
    (data / "gsm8k").mkdir(parents=True)
    (data / "gsm8k" / "test.jsonl").write_text('{"question": "local?", "answer": "#### 5"}\n')
    assert [r.answer for r in loaders.load_dataset("gsm8k", "test")] == ["5"] and hub == []
    # a data folder without this dataset's file: the hub copy, and the error says both
    monkeypatch.setattr(loaders, "hub_reachable", lambda: False)
    with pytest.raises(DataError) as info:
        loaders.load_dataset("svamp")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("dataset 'svamp': split 'test': ") and "svamp/SVAMP.json not found" in msg
    assert "its hub copy 'ChilleD/SVAMP': the Hugging Face hub could not be reached" in msg


def test_a_hub_dataset_with_several_configs_is_named_with_config(hub):
    """``repo:split?config=NAME`` passes the config; without it, the hub's refusal is one line saying how."""
    from dgrpo.data import load_spec

    assert [r.answer for r in load_spec("openai/gsm8k:test?config=main")] == ["7"]
    assert hub[-1] == ("openai/gsm8k", "main", "test")
    with pytest.raises(DataError, match=r"has several configs: name one as openai/gsm8k:SPLIT\?config=NAME .*'main'"):
        load_spec("openai/gsm8k:test")
    with pytest.raises(DataError, match=r"one option, \?config=NAME"):
        load_spec("openai/gsm8k:test?revision=x")
    with pytest.raises(DataError, match=r"names one of a hub dataset's configs; this is not one"):
        load_spec("gsm8k:test?config=main")  # a built-in name has no hub config to pick


def test_a_data_dir_that_is_no_folder_is_an_error(monkeypatch, tmp_path):
    """A mistyped DGRPO_DATA_DIR fell back to ./data (or to the hub's copy) without a word."""
    from dgrpo.data.loaders import find_data_dir, load_dataset

    monkeypatch.setenv("DGRPO_DATA_DIR", str(tmp_path / "dta"))
    with pytest.raises(DataError, match=rf"^DGRPO_DATA_DIR={tmp_path / 'dta'}: no such folder \(unset it"):
        find_data_dir()
    with pytest.raises(DataError, match="DGRPO_DATA_DIR"):
        load_dataset("svamp")
    monkeypatch.setenv("DGRPO_DATA_DIR", str(tmp_path))
    assert find_data_dir() == tmp_path.resolve()


def test_training_data_from_the_hub_named_without_a_split_takes_its_train_split(hub):
    """``data.train=org/name`` trained on the hub dataset's test split (a name alone means the test split), where
    the option's help says a dataset with a train split named without one takes it."""
    from dgrpo.data import load_spec, training_split

    assert training_split("ChilleD/SVAMP") == "ChilleD/SVAMP:train"
    assert training_split("openai/gsm8k?config=main") == "openai/gsm8k:train?config=main"
    assert training_split("openai/gsm8k:test?config=main") == "openai/gsm8k:test?config=main"  # a split given is kept
    assert [r.question for r in load_spec(training_split("ChilleD/SVAMP"))] == ["5 birds. Legs?"]
    assert hub[-1] == ("ChilleD/SVAMP", None, "train")
    with pytest.raises(
        DataError,
        match=r"^hub dataset 'openai/gsm8k' has no split 'train': name one as openai/gsm8k:SPLIT\?config=main ",
    ):
        load_spec(training_split("openai/gsm8k?config=main"))  # (the made-up hub holds only its test split)


def test_a_hub_dataset_missing_offline_says_how_to_get_it(hub, monkeypatch):
    """Offline and not in the datasets cache: the line said the hub could not be reached, not what to do."""

    def offline(repo, config=None, split=None):  # (datasets' words in offline mode)
        raise ConnectionError(f"Couldn't reach '{repo}' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(DataError) as info:
        loaders.load_dataset("org/mine", "test")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("unknown dataset 'org/mine': not a local file")
    assert msg.endswith(
        "(HF_DATASETS_OFFLINE is set and the dataset is not in the datasets cache: load it once where there is "
        "network with this HF_HOME, or unset HF_DATASETS_OFFLINE)"
    )


def test_a_failed_hub_read_is_dgrpo_s_line_alone_and_one_that_succeeds_keeps_the_library_lines(
    hub, monkeypatch, caplog
):
    """A hub that answers 503 (a proxy that blocks it) made huggingface_hub log a line per try ("HTTP Error 503 thrown
    while requesting ...", "Retrying in 1s [Retry 1/5].") before dgrpo's one-line error, which gives the reason: the
    library's lines are held during the read and dropped when it fails; a read that succeeds prints them."""
    said, hub_logger = logging.getLogger("huggingface_hub.utils._http"), logging.getLogger("huggingface_hub")
    before = (hub_logger.handlers[:], hub_logger.propagate)

    def failing(repo, config=None, split=None):
        said.warning("HTTP Error 503 thrown while requesting HEAD https://huggingface.co/datasets/%s", repo)
        raise FileNotFoundError(f"Couldn't find '{repo}' on the Hugging Face Hub either")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=failing))
    with caplog.at_level(logging.WARNING), pytest.raises(DataError, match="Couldn't find 'org/mine' on the Hugging"):
        loaders.load_dataset("org/mine", "test")
    assert caplog.records == []

    def retried(repo, config=None, split=None):
        said.warning("Retrying in 1s [Retry 1/5].")
        return [{"question": "1 + 1?", "answer": "2"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=retried))
    with caplog.at_level(logging.WARNING):
        assert [r.answer for r in loaders.load_dataset("org/mine", "test")] == ["2"]
    assert [r.getMessage() for r in caplog.records] == ["Retrying in 1s [Retry 1/5]."]
    assert (hub_logger.handlers, hub_logger.propagate) == before  # (as they were, outside the read)


def test_a_local_parquet_file_is_read_without_the_datasets_progress_bar(tmp_path, capfd):
    """A parquet file read through the datasets package printed its progress bar ('Generating train split: 2
    examples [00:00, ...]') to stderr above the command's own lines, the first time each file was read (the hub's log
    lines were held, not its bars). None is printed; the bars are as they were after the read, and a failed one."""
    datasets = pytest.importorskip("datasets")
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")

    before = datasets.utils.are_progress_bars_disabled()
    path = tmp_path / "fresh.parquet"  # (a path never read: datasets builds its cached copy, with its bar)
    pq.write_table(pa.table({"question": ["1 + 1?", "2 + 2?"], "answer": ["2", "4"]}), str(path))
    capfd.readouterr()
    assert [r.answer for r in loaders.load_dataset(str(path))] == ["2", "4"]
    out, err = capfd.readouterr()
    assert (out, err) == ("", "") and datasets.utils.are_progress_bars_disabled() == before
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="not a readable parquet file"):
        loaders.load_dataset(str(tmp_path / "bad.parquet"))
    assert datasets.utils.are_progress_bars_disabled() == before


def test_a_typo_of_a_built_in_dataset_name_is_told_the_close_name(hub, monkeypatch):
    """``svmap`` (for svamp) was asked of the hub and refused as an unknown dataset without the name meant; a hub id
    (``org/name``) is never taken for a built-in name's typo."""

    def offline(repo, config=None, split=None):
        raise ConnectionError(f"Couldn't reach '{repo}' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    for typed, meant in (("svmap", "svamp"), ("GSM8KK", "gsm8k"), ("multiarth", "multiarith")):
        with pytest.raises(DataError) as info:
            loaders.load_dataset(typed, "test")
        assert str(info.value).startswith(f"unknown dataset {typed!r} (did you mean {meant!r}?): not a local file")
    with pytest.raises(DataError) as info:
        loaders.load_dataset("org/svmap", "test")
    assert "did you mean" not in str(info.value)
