from mlx_paged.sampling.stop_strings import StopStringMatcher, partial_suffix_len


def feed_all(matcher, pieces):
    out, matched = [], False
    for p in pieces:
        text, matched = matcher.feed(p)
        out.append(text)
        if matched:
            break
    return out, matched


def test_stop_split_across_tokens_is_never_emitted():
    m = StopStringMatcher(["END"])
    out, matched = feed_all(m, ["Hello ", "E", "N", "D", " never"])
    assert out == ["Hello ", "", "", ""] and matched


def test_false_start_is_released_once_it_cannot_match():
    m = StopStringMatcher(["END"])
    assert m.feed("abc E") == ("abc ", False)
    assert m.feed("N") == ("", False)
    assert m.feed("X") == ("ENX", False)


def test_overlapping_prefix_keeps_the_right_tail():
    m = StopStringMatcher(["aab"])
    assert feed_all(m, ["a", "a", "a", "b"]) == (["", "", "a", ""], True)


def test_earliest_of_several_stops_wins_and_rest_is_dropped():
    m = StopStringMatcher(["\n\n", "User:"])
    assert m.matched is None
    assert m.feed("one User: two\n\nthree") == ("one ", True)
    assert m.matched == "User:"  # the one that ended the text, for stop_sequence


def test_flush_returns_held_text():
    m = StopStringMatcher(["###"])
    assert m.feed("done #") == ("done ", False)
    assert m.flush() == "#"
    assert m.flush() == ""


def test_no_stops_passes_through():
    assert StopStringMatcher([]).feed("anything") == ("anything", False)


def test_partial_suffix_len():
    assert partial_suffix_len("xxab", ["abc"]) == 2
    assert partial_suffix_len("xxab", ["zzz"]) == 0
    assert partial_suffix_len("abc", ["abc"]) == 0  # a whole match is not a partial
