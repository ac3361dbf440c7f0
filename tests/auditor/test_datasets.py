"""Datasets, canaries, neighbour pairs and the audit prompts (no server needed)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from dpicl_audit.datasets import BUNDLED, Example, LabelledDataset, load_dataset
from dpicl_audit.errors import DatasetError
from dpicl_audit.mechanisms.neighbours import random_canary_text
from dpicl_audit.mechanisms.voting.audit import VOTING
from dpicl_audit.mechanisms.voting.build import build_design
from dpicl_audit.mechanisms.voting.design import AuditDesign
from dpicl_audit.plan import AuditPlan
from dpicl_audit.prompts import (
    AUDIT_TEMPLATE,
    CLASSIFY_TEMPLATE,
    brainwash_query,
    deployment_query,
)

# ------------------------------------------------------------------ datasets


def test_bundled_corpus() -> None:
    ds = load_dataset("news-mini")
    assert len(ds) == 200
    assert ds.labels == ("World", "Sports", "Business", "Sci/Tech")
    for label in ds.labels:
        assert sum(e.output == label for e in ds.examples) == 50
    texts = [e.input for e in ds.examples]
    assert len(set(texts)) == len(texts)
    assert all(len(t) >= 8 for t in texts)
    # no text is contained in another: replace-one pairs and membership queries stay clean
    for a in texts:
        assert not any(a != b and a in b for b in texts)


def test_bundled_reviews() -> None:
    # Two balanced labels: the majority-class rate of the whole set is exactly 0.5.
    ds = load_dataset("reviews-mini")
    assert len(ds) == 240
    assert sorted(ds.labels) == ["negative", "positive"]
    for label in ds.labels:
        assert sum(e.output == label for e in ds.examples) == 120
    texts = [e.input for e in ds.examples]
    assert all(len(t.split()) >= 4 for t in texts)
    for a in texts:
        assert not any(a != b and a in b for b in texts)


def test_bundled_corpus_ships_as_package_data() -> None:
    pyproject = Path(__file__).parents[2] / "auditor" / "pyproject.toml"
    assert '"data/*"' in pyproject.read_text()
    data = Path(sys.modules["dpicl_audit"].__file__ or "").parent / "data"
    for filename in BUNDLED.values():
        assert (data / filename).is_file()


def test_jsonl_and_csv(tmp_path: Path) -> None:
    jl = tmp_path / "d.jsonl"
    jl.write_text(
        "\n".join(
            [
                json.dumps({"input": "first example text", "output": "A"}),
                "",
                json.dumps({"text": "second example text", "label": "B"}),
                json.dumps({"text": "first example text", "label": "B"}),  # duplicate text
            ]
        )
    )
    ds = load_dataset(str(jl))
    assert ds.examples == (Example("first example text", "A"), Example("second example text", "B"))
    assert ds.labels == ("A", "B")

    csv_path = tmp_path / "d.csv"
    csv_path.write_text('text,label\n"hello, world text",X\nanother text here,Y\n')
    ds2 = load_dataset(str(csv_path))
    assert ds2.examples[0] == Example("hello, world text", "X")
    assert ds2.labels == ("X", "Y")

    arr = tmp_path / "a.json"
    arr.write_text(json.dumps([{"input": "array example one", "output": "L"}]))
    assert len(load_dataset(str(arr))) == 1


@pytest.mark.parametrize(
    ("content", "suffix", "needle"),
    [
        ('{"input": "x"}\n', ".jsonl", "no label field"),
        ("{not json\n", ".jsonl", "not valid JSON"),
        ("[1, 2]", ".json", "JSON object"),
        ("", ".csv", "header"),
        ("a,b\n1,2\n", ".csv", "no input field"),
        ("whatever", ".txt", "must end in"),
    ],
)
def test_bad_files(tmp_path: Path, content: str, suffix: str, needle: str) -> None:
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    with pytest.raises(DatasetError, match=needle):
        load_dataset(str(path))


@pytest.mark.parametrize(
    ("content", "suffix", "needle"),
    [
        # Each was a traceback (UnicodeDecodeError, RecursionError, ValueError, csv.Error).
        (b'{"input": "\xff"}\n', ".jsonl", r"not UTF-8 text \(byte b'\\xff' at position 11\)"),
        (b"input,label\n\xfe,x\n", ".csv", "not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, ".json", "nested deeper than the parser's limit"),
        (b'{"input": ' + b"1" * 5000 + b', "label": "x"}\n', ".jsonl", "4300 digits"),
        (b"input,label\n" + b"x" * 200_000 + b",y\n", ".csv", "not valid CSV: field larger"),
    ],
)
def test_files_that_are_not_datasets(
    tmp_path: Path, content: bytes, suffix: str, needle: str
) -> None:
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=needle):
        load_dataset(str(path))


def test_unknown_dataset_and_hf() -> None:
    with pytest.raises(DatasetError, match="neither a bundled corpus"):
        load_dataset("/no/such/file.jsonl")
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(DatasetError, match="optional 'datasets' package"):
            load_dataset("hf:ag_news")


def test_empty_dataset() -> None:
    with pytest.raises(DatasetError, match="no usable examples"):
        LabelledDataset.of("x", [Example(" ", "A")])


# ------------------------------------------------------------------ oracle rules
# The oracle simulator's rules (docs/architecture.md), re-stated here so the auditor's
# prompts are checked against the contract without importing the server.

_QUOTED = re.compile(r"""'([^']+)'|"([^"]+)\"""")


def oracle_options(instructions: str, query: str, labels: Sequence[str]) -> list[str] | None:
    """The quoted labels in order of appearance if the prompt is a membership prompt."""
    text = instructions + query
    if "present" not in instructions and "present" not in query:
        return None
    quoted = [a or b for a, b in _QUOTED.findall(text)]
    options = [q for q in quoted if q in labels]
    seen: list[str] = []
    for opt in options:
        if opt not in seen:
            seen.append(opt)
    return seen if len(seen) >= 2 else None


def oracle_present(exemplars: Sequence[Example], query: str) -> bool:
    return any(len(e.input.strip()) >= 8 and e.input.strip() in query for e in exemplars)


def instructions_of(template: str | None) -> str:
    t = template or "Classify the input. Answer with exactly one of these labels: {labels}."
    return t.replace("{exemplars}", "").replace("{query}", "")


def _plan(**kw: object) -> AuditPlan:
    # paper 000's design; the pinned designs are tested in tests/auditor/test_designs.py
    return AuditPlan.from_sources(None, {"seed": 3, "design": "paper", **kw})


@pytest.mark.parametrize("canary", ["natural", "mislabeled", "random"])
@pytest.mark.parametrize("setting", ["audit-template", "deployment"])
def test_neighbour_pair_is_replace_one(canary: str, setting: str) -> None:
    ds = load_dataset("news-mini")
    plan = _plan(canary=canary, setting=setting)
    d = build_design(plan, ds)
    k = plan.mechanism.n_exemplars
    c1, c0 = d.exemplars_c1, d.exemplars_c0
    assert len(c1) == len(c0) == k
    diff = [i for i in range(k) if c1[i] != c0[i]]
    assert diff == [d.position]
    assert c1[d.position] == d.canary and c0[d.position] == d.replacement
    assert d.canary.input != d.replacement.input
    assert all(e.output in d.labels for e in (*c1, *c0))
    # the same partition seed goes to both contexts
    b1 = VOTING.context_body(d, plan, 2.0, 1, name="c1")
    b0 = VOTING.context_body(d, plan, 2.0, 0, name="c0")
    assert b1["mechanism"] == b0["mechanism"]
    assert b1["mechanism"]["partition_seed"] == d.partition_seed
    assert b1["mechanism"]["epsilon"] == 2.0
    assert b1["labels"] == b0["labels"]
    if canary == "natural" and setting == "deployment":
        assert d.canary in ds.examples
    if canary == "mislabeled" and setting == "deployment":
        truth = {e.input: e.output for e in ds.examples}[d.canary.input]
        assert d.canary.output != truth
    if canary == "random":
        assert d.canary.input not in {e.input for e in ds.examples}


@pytest.mark.parametrize("setting", ["audit-template", "deployment"])
def test_inquery_prompts_follow_the_oracle_rules(setting: str) -> None:
    ds = load_dataset("news-mini")
    d = build_design(_plan(setting=setting), ds)
    options = oracle_options(instructions_of(d.template), d.query, d.labels)
    assert options is not None
    assert options[:2] == [d.positive, d.negative]
    assert oracle_present(d.exemplars_c1, d.query)
    assert not oracle_present(d.exemplars_c0, d.query)
    if setting == "audit-template":
        assert d.labels == ("Yes", "No") and d.template == AUDIT_TEMPLATE
        assert d.query == d.canary.input
    else:
        assert d.template is None  # the deployed (server default) template, unchanged
        assert d.query == deployment_query(d.canary.input, d.positive, d.negative or "")


def test_deployment_labels_and_answers() -> None:
    ds = load_dataset("news-mini")
    d = build_design(
        _plan(
            setting="deployment",
            **{"deployment.positive": "Business", "deployment.negative": "World"},
        ),
        ds,
    )
    assert (d.positive, d.negative) == ("Business", "World")
    assert d.query.index('"Business"') < d.query.index('"World"')
    with pytest.raises(DatasetError, match="not in the deployment's label set"):
        build_design(_plan(setting="deployment", **{"deployment.labels": ["World", "Sports"]}), ds)


def test_brainwash_design() -> None:
    ds = load_dataset("news-mini")
    d = build_design(_plan(attack="brainwash", canary="mislabeled"), ds)
    assert d.template == CLASSIFY_TEMPLATE and d.labels == ds.labels
    assert d.positive == d.canary.output and d.negative is None
    assert d.wrong_label is not None and d.wrong_label != d.canary.output
    assert d.query.count(d.canary.input) == 7  # six injected copies and the question
    assert d.query.count(f"Label: {d.wrong_label}") == 6
    assert oracle_options(instructions_of(d.template), d.query, d.labels) is None
    expected = "abc text\nLabel: X\n\nQuery Text: abc text"
    assert brainwash_query("abc text", "X", repeats=1) == expected


def test_design_is_deterministic_and_round_trips() -> None:
    ds = load_dataset("news-mini")
    a = build_design(_plan(), ds)
    b = build_design(_plan(), ds)
    assert a == b
    assert build_design(_plan(seed=4), ds) != a
    assert AuditDesign.from_json(json.loads(json.dumps(a.to_json()))) == a
    fixed = build_design(_plan(**{"neighbour.position": 0, "neighbour.partition_seed": 5}), ds)
    assert fixed.position == 0 and fixed.partition_seed == 5


def test_decision_rules() -> None:
    ds = load_dataset("news-mini")
    d = build_design(_plan(), ds)
    assert d.decide_label("Yes") == 1 and d.decide_label("No") == 0
    assert d.score({"Yes": 3.0, "No": 1.5}) == pytest.approx(1.5)
    bw = build_design(_plan(attack="brainwash"), ds)
    votes = dict.fromkeys(bw.labels, 0.0) | {bw.positive: 2.0}
    other = next(lab for lab in bw.labels if lab != bw.positive)
    votes[other] = 5.0
    assert bw.score(votes) == pytest.approx(-3.0)
    with pytest.raises(KeyError, match="lack the label"):
        d.score({"Yes": 1.0})
    assert d.clean_vector({"No": 3}) == [0.0, 3.0]


def test_too_small_dataset() -> None:
    ds = LabelledDataset.of("tiny", [Example(f"example number {i}", "AB"[i % 2]) for i in range(5)])
    with pytest.raises(DatasetError, match="the contexts need 8"):
        build_design(_plan(), ds)


def test_random_canary_text() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    t = random_canary_text(rng)
    assert len(t) >= 8 and "'" not in t and '"' not in t and t.endswith(".")
