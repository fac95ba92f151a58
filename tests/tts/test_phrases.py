"""Cutting streamed text into phrases (pure logic, no server)."""

from services.tts.phrases import PhraseSplitter


def feed_all(pieces, **kwargs):
    splitter = PhraseSplitter(**kwargs)
    phrases = [phrase for piece in pieces for phrase in splitter.feed(piece)]
    return phrases, splitter


def test_sentences_are_cut_once_the_following_space_arrives():
    phrases, splitter = feed_all(["Hello world.", " How are", " you? Fine"])
    assert phrases == ["Hello world.", "How are you?"]
    assert splitter.flush() == ["Fine"]


def test_numbers_and_abbreviations_without_a_space_are_not_cut():
    phrases, splitter = feed_all(["It costs 3.5 euros", " today"])
    assert phrases == [] and splitter.flush() == ["It costs 3.5 euros today"]


def test_commas_cut_only_after_min_chars():
    phrases, _ = feed_all(["Yes, well, that is quite a long clause, and more"], min_chars=12)
    assert phrases == ["Yes, well, that is quite a long clause,"]


def test_cjk_full_stops_cut_without_spaces():
    phrases, splitter = feed_all(["你好。今天天气很好！还有"])
    assert phrases == ["你好。", "今天天气很好！"] and splitter.flush() == ["还有"]


def test_text_without_punctuation_is_cut_at_a_space_before_max_chars():
    phrases, splitter = feed_all(["word " * 30], max_chars=40)
    assert all(len(p) <= 40 for p in phrases) and len(phrases) >= 3
    assert " ".join(phrases + splitter.flush()).split() == ["word"] * 30


def test_flush_of_nothing_is_nothing():
    assert PhraseSplitter().flush() == []
