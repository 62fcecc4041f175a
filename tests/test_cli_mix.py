"""The command line's mixes: `info A B --weights`, `preview A B --weights` (each tile names its source),
`train A B --weights --epoch-size` (its loaders: the train mix, the val mix in the train mix's classes)."""
from __future__ import annotations

import json

import pytest

from datapipe.cli.main import main
from datapipe.cli.mix import parse_weights
from datapipe.mix.sources import mix_source, source_names


def test_source_names_from_files_or_given_and_unique():
    assert source_names(["in1k.lmdb", "s3://b/web.wds", "photos/", "x/in1k.lmdb", "mine=data/a.h5"]) == {
        "in1k.lmdb": "in1k.lmdb", "web.wds": "s3://b/web.wds", "photos": "photos/", "in1k.lmdb-2": "x/in1k.lmdb",
        "mine": "data/a.h5"}


@pytest.mark.parametrize("text, message", [("0.7", "gives 1 weight"), ("a,b", "numbers separated by commas"),
                                           ("1,-1", ">= 0"), ("1,nan", ">= 0")])
def test_bad_weights_are_one_line(text, message):
    with pytest.raises(ValueError, match=message):
        parse_weights(text, 2)


def test_info_prints_the_mix_table(packed_lmdb, packed_wds, capsys):
    assert main(["info", f"in1k={packed_lmdb}", f"web={packed_wds}", "--weights", "0.7,0.3", "--epoch-size", "40"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("mix of 2 sources, 40 samples an epoch")
    rows = {line.split()[0]: line.split() for line in out[2:4]}
    assert rows["in1k"][1:4] == ["27", "0.700", "28"] and rows["web"][1:4] == ["27", "0.300", "12"]
    assert rows["in1k"][4] == "0.96"  # it repeats a record within an epoch


def test_info_json_and_one_dataset_as_before(packed_lmdb, packed_wds, capsys):
    assert main(["info", str(packed_lmdb), str(packed_wds), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["epoch_size"] == 54 and [s["draws"] for s in body["sources"]] == [27, 27]
    assert main(["info", str(packed_lmdb)]) == 0
    assert "mix of" not in capsys.readouterr().out


def test_a_weights_count_mismatch_is_one_line(packed_lmdb, packed_wds, capsys):
    assert main(["info", str(packed_lmdb), str(packed_wds), "--weights", "1"]) != 0
    err = capsys.readouterr().err.strip()
    assert "gives 1 weight for 2 datasets" in err and "\n" not in err


def test_preview_tiles_name_their_source(packed_lmdb, packed_wds):
    from datapipe.preview import PreviewOptions, preview

    shown = preview(mix_source([f"a={packed_lmdb}", f"b={packed_wds}"], (0.5, 0.5), 8),
                    PreviewOptions(records=8, epochs=1, backends=("threads",)))
    heads = [caption[0] for caption in shown.rows[0].captions]
    assert {h.split()[0] for h in heads} == {"a", "b"} and all(" #" in h for h in heads)


def test_train_loaders_over_a_mix(packed_lmdb, packed_wds, tmp_path):
    import torch

    from datapipe import make_loader, open_dataset
    from datapipe.train.config import TrainConfig
    from datapipe.train.loaders import build_loaders

    config = TrainConfig(data=[str(packed_lmdb), str(packed_wds)], out=str(tmp_path), weights=(3, 1), epoch_size=20,
                         batch_size=4, image_size=32, workers=0, backend="threads")
    train, val = build_loaders(config, torch.device("cpu"))
    assert train.mix.counts(0) == (15, 5) and len(train.mix) == 20
    assert val.mix is not None and len(val.mix) == sum(val.mix.sizes)  # each val record once
    names = val.mix.names
    batch = next(iter(make_loader(val.mix, train=False, batch_size=len(val.mix), image_size=16,
                                  fields=("image", "label", "source"))))
    for s, i, label in zip(batch.sources, batch.indices, batch.labels):  # labels in the train mix's classes
        own = open_dataset([packed_lmdb, packed_wds][names.index(names[int(s)])], "val")
        assert train.mix.classes[int(label)] == own.classes[own[int(i)].label]
    with pytest.raises(ValueError, match="epoch_size must be"):
        TrainConfig(data=[str(packed_lmdb)], out=str(tmp_path), epoch_size=0)


def test_info_json_says_never_as_null_and_hides_credentials(packed_lmdb, packed_wds, capsys):
    assert main(["info", str(packed_lmdb), str(packed_wds), "--weights", "1,0", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)  # strict JSON: no Infinity
    assert body["sources"][1]["draws"] == 0 and body["sources"][1]["epochs_per_pass"] is None


def test_info_shares_of_weights_whose_sum_overflows_a_float(packed_lmdb, packed_wds, capsys):
    """1e308 + 1e308 is inf as floats: the shares read 0.000/0.000."""
    assert main(["info", str(packed_lmdb), str(packed_wds), "--weights", "1e308,1e308", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [s["weight"] for s in body["sources"]] == [0.5, 0.5] and [s["draws"] for s in body["sources"]] == [27, 27]


def test_decimal_weights_count_as_the_decimals_written(packed_lmdb, packed_wds, capsys):
    """0.7,0.3 and 7,3 at 35 samples: 24/11 and 25/10 before (the binary 0.7 is below 7/10)."""
    draws = []
    for weights in ("0.7,0.3", "7,3"):
        assert main(["info", str(packed_lmdb), str(packed_wds), "--weights", weights, "--epoch-size", "35",
                     "--json"]) == 0
        draws.append([s["draws"] for s in json.loads(capsys.readouterr().out)["sources"]])
    assert draws == [[25, 10], [25, 10]]


def test_a_weight_a_float_would_read_as_zero_is_one_line():
    with pytest.raises(ValueError, match=r"^--weights '1e-400' is below the smallest float"):
        parse_weights("1e-400,1", 2)
    assert parse_weights("0,1", 2) == (0.0, 1.0) and parse_weights("0.0e5,1", 2) == (0.0, 1.0)


@pytest.mark.parametrize("recipe", ["deit", "tv-v2"])
def test_train_over_a_mix_with_a_recipe_that_repeats_each_record(packed_lmdb, packed_wds, tmp_path, recipe):
    """deit (aug_repeats=3) and tv-v2 (4) over a mix: was refused ("aug_repeats=3 ... is not available
    over a Mix")."""
    out = tmp_path / recipe
    assert main(["train", f"a={packed_lmdb}", f"b={packed_wds}", "--weights", "0.7,0.3", "--epoch-size", "24",
                 "--recipe", recipe, "--model", "resnet18", "--epochs", "1", "--batch-size", "4", "--image-size", "32",
                 "--workers", "0", "--backend", "threads", "--max-steps", "2", "--out", str(out)]) == 0
    assert (out / "last.pt").is_file()
    assert parse_weights("\u0660,1", 2) == (0.0, 1.0)
    with pytest.raises(ValueError, match="below the smallest float"):
        parse_weights("\u0661e-400,1", 2)  # Arabic-Indic digits, which float() reads


def test_a_name_given_to_two_datasets_is_one_line(packed_lmdb, packed_wds, capsys):
    """`info a=X a=Y` renamed the second to a-2 without a word (a name made from two alike paths still is)."""
    assert main(["info", f"a={packed_lmdb}", f"a={packed_wds}"]) != 0
    err = capsys.readouterr().err.strip()
    assert "the name 'a' is given to two datasets" in err and "\n" not in err
    assert main(["info", str(packed_lmdb), f"{packed_lmdb}/"]) == 0  # alike paths: named apart, as before
