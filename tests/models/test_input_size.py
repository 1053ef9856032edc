"""`--input-size`: S (a square RGB image, 3,S,S) or C,H,W; anything else is one line naming the
flag, what was given and what to write instead."""

from __future__ import annotations

import pytest

from flatcheck.errors import ConfigError
from flatcheck.models.resolve import parse_input_size


@pytest.mark.parametrize("text, size", [("32", (3, 32, 32)), ("1,8,8", (1, 8, 8)), ("3x224x224", (3, 224, 224))])
def test_a_size_reads_as_c_h_w(text, size):
    assert parse_input_size(text) == size


def test_two_numbers_are_told_what_to_write():
    """"3,8" (an H,W pair, or a C and a side) said only that it was not S or C,H,W; the wrong
    size of flat data gets a hint naming --set 'input_size=[D]', and so does this now."""
    with pytest.raises(ConfigError) as info:
        parse_input_size("3,8", "--input-size")
    message = str(info.value)
    assert "\n" not in message
    assert message == ("--input-size expects S or C,H,W positive integers, got '3,8' (2 numbers): an image "
                       "takes C,H,W (an RGB 3×8: 3,3,8), a lone S means 3,S,S, and a flat input of D values "
                       "takes --set 'input_size=[D]'")


@pytest.mark.parametrize("text", ["0", "a,b,c", "1,2,3,4", ""])
def test_other_bad_sizes_name_the_flag(text):
    with pytest.raises(ConfigError, match=f"^--input-size expects S or C,H,W positive integers, got {text!r}"):
        parse_input_size(text)
