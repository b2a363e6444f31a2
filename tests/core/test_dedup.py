from gymforge.core.dedup import find_duplicate, normalise


def test_variants_of_a_topic_are_duplicates():
    accepted = [("t0000", "Credit default prediction")]
    assert find_duplicate("credit-default predictions", accepted, 0.8) == "t0000"
    assert find_duplicate("Prediction of credit default", accepted, 0.8) == "t0000"


def test_distinct_topics_are_kept():
    accepted = [("t0000", "Credit default prediction")]
    assert find_duplicate("Credit card fraud detection", accepted, 0.8) is None
    assert normalise("The Iris  species!") == normalise("iris species")
