"""A list sent to PostgreSQL as one array parameter in the array's text form
(:func:`amqp_lab.dedup.arrays.array_literal`): every element its own, none read as NULL."""

from __future__ import annotations

import enum

import pytest

from amqp_lab.dedup.arrays import array_literal

pytestmark = pytest.mark.unit


class Seven(enum.IntEnum):
    SEVEN = 7


def test_ints_are_written_as_they_are() -> None:
    assert array_literal([3, -1, 2**62]) == "{3,-1,4611686018427387904}"
    assert array_literal([Seven.SEVEN, 8]) == "{7,8}"  # an int subclass is its int
    assert array_literal([]) == "{}"


def test_every_text_is_quoted_with_its_quotes_and_backslashes_escaped() -> None:
    texts = ['a"b', "c\\d", "NULL", "", " sp ", "{x}", "a,b"]
    assert array_literal(texts) == ('{"a\\"b","c\\\\d","NULL",""," sp ","{x}","a,b"}')


@pytest.mark.parametrize("values", [[1, "2"], ["a", 2], [True], [1, 2.5], [None], ["a", None]])
def test_an_element_of_another_type_is_a_type_error(values: list[object]) -> None:
    with pytest.raises(TypeError, match="an array of"):
        array_literal(values)  # type: ignore[arg-type]
