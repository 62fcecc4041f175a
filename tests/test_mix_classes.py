"""Class names across a mix's sources: a name equal to an earlier source's once both are NFC-normalised
(one written decomposed, as macOS file systems do) is that class, with a warning; a name that differs
from an earlier one only in case is refused in one line naming both names and their sources (was: each
silently became a class of its own, so one class's records taught two labels)."""
from __future__ import annotations

import logging
import re
import unicodedata

import pytest

from datapipe.mix.sources import Mix
from tests.test_mix_order import Classed

NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")


def mix_of(by_source: dict[str, list[str]], **kw) -> Mix:
    return Mix({name: Classed(name, 10, names) for name, names in by_source.items()}, **kw)


def test_names_equal_once_normalised_are_one_class_with_a_warning(caplog):
    assert NFC != NFD
    with caplog.at_level(logging.WARNING, logger="datapipe"):
        mix = mix_of({"linux": ["bar", NFC], "mac": [NFD, "dog"]})
    assert mix.classes == ["bar", NFC, "dog"] and mix.class_maps == ((0, 1), (1, 2))
    assert any("another Unicode form" in r.getMessage() and "'mac'" in r.getMessage() for r in caplog.records)


def test_names_that_differ_only_in_case_are_refused_naming_both():
    with pytest.raises(ValueError, match=r"^class 'dog' of source 'b' and class 'Dog' of source 'a' differ only in "
                                         r"case: rename one") as err:
        mix_of({"a": ["Dog", "cat"], "b": ["dog"]})
    assert "\n" not in str(err.value)
    upper = unicodedata.normalize("NFD", "CAFÉ")
    with pytest.raises(ValueError, match=re.escape(f"class {upper!r} of source 'b' and class {NFC!r} of source 'a'")):
        mix_of({"a": [NFC], "b": [upper]})


def test_a_sources_own_names_stay_its_classes():
    """One dataset may hold 'Dog' and 'dog' (its own class list, as ImageFolder keeps it): both stay,
    and a later source's exact 'dog' is that one."""
    mix = mix_of({"a": ["Dog", "dog"], "b": ["dog", "emu"]})
    assert mix.classes == ["Dog", "dog", "emu"] and mix.class_maps == ((0, 1), (1, 2))


def test_a_val_mix_labelled_as_its_train_mix_merges_the_same_way():
    mix = mix_of({"v": [NFD]}, classes=[NFC, "dog"])
    assert mix.class_maps == ((0,),)
    with pytest.raises(ValueError, match="class 'DOG' of source 'v' and class 'dog' of the given classes differ only"):
        mix_of({"v": ["DOG"]}, classes=[NFC, "dog"])
