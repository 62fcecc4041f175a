"""Lists from user data in messages (issue #38 row 11): a 10 MB class name given twice became a 20 MB error
line (the whole class list was printed). Each list is summarised: its count and its first names, each quoted
and shortened, the line capped."""
from __future__ import annotations

import pytest

from datapipe.errors import quoted, summary
from datapipe.records import ClassIndex

BIG = "n" * 10_000_000


def test_a_duplicated_ten_megabyte_class_name_is_a_short_line_naming_it():
    with pytest.raises(ValueError) as caught:
        ClassIndex(["a", BIG, "b", BIG])
    assert str(caught.value) == f"class names must be unique; 1 duplicate class name: '{'n' * 75}'..."


def test_several_duplicates_are_counted_and_the_first_named():
    with pytest.raises(ValueError, match=r"^class names must be unique; 3 duplicate class names, the first: 'cat'$"):
        ClassIndex(["cat", "dog", "cat", "eel", "dog", "eel", "fox"])


def test_an_unknown_class_names_it_and_the_first_ten_classes_shortened():
    long = "n" * 100_000
    classes = ClassIndex([long + str(n) for n in range(1000)])
    with pytest.raises(ValueError) as caught:
        classes.label(BIG)
    message = str(caught.value)
    assert message.startswith(f"unknown class '{'n' * 75}'...; the class list (from the train split) has 1,000 "
                              f"classes, the first 10: '{'n' * 75}'..., ")
    assert message.endswith(", ...") and len(message) < 1200 and "\n" not in message


@pytest.mark.parametrize("value, shown", [("cat", "'cat'"), ("a\nb", "'a\\nb'"), ("x" * 81, "'" + "x" * 75 + "'..."),
                                          ("\0" * 100, "'" + "\\x00" * 18 + "\\x0'...")])
def test_a_name_is_quoted_on_one_line_within_about_eighty_characters(value, shown):
    assert quoted(value) == shown and len(quoted(value)) <= 80


def test_summary_counts_and_shows_the_first_items():
    assert summary([], "class", "classes") == "no classes"
    assert summary(["a"], "member extension") == "1 member extension: 'a'"
    assert summary(["a", "b", "c"], "class", "classes", show=2) == "3 classes, the first 2: 'a', 'b', ..."
    assert summary(["a", "b"], "class", "classes", show=5) == "2 classes: 'a', 'b'"
