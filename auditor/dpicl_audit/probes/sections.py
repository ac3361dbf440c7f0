"""The shapes of what the probes from outside write into a run's results: the ledger's
section (:mod:`.ledger`) with its bursts (:mod:`.ledger_burst`), the client parameters'
sweep (:mod:`.parameters`), inputs up to the limits (:mod:`.limits`), the surface's
(:mod:`.surface`) with the answers it reads, the debug switches' (:mod:`.switches`), the
calibration scan (:mod:`.calibration`) and voting's noise tails
(:mod:`dpicl_audit.probes.tails`).
The report and the exit code read them back as stored JSON
(:class:`dpicl_audit.results.RunResult`)."""

from __future__ import annotations

from typing import Literal, NotRequired, Required, TypedDict

from pydantic import JsonValue

from dpicl_audit.estimators.channels import RefusalTest, TimingTest
from dpicl_audit.estimators.extra_fields import Dependence

__all__ = [
    "AboveLimit",
    "Answer",
    "BurstFailure",
    "BurstRoute",
    "BurstsSection",
    "CalibrationPoint",
    "CalibrationSection",
    "LedgerCheck",
    "LedgerSection",
    "LedgerStatus",
    "LimitsSection",
    "LimitsSize",
    "LimitsWorld",
    "ParameterVariant",
    "ParametersSection",
    "Scalar",
    "SurfaceRoute",
    "SurfaceSection",
    "SwitchFinding",
    "SwitchesSection",
    "TailsSection",
]


class BurstFailure(TypedDict):
    """A check of one burst that failed: what the server did and what it should have."""

    check: str
    reported: JsonValue
    expected: JsonValue


class BurstRoute(TypedDict, total=False):
    """One route's burst: ``ok`` None where it was not run (no such route, no count known),
    with only ``route``, ``ok`` and ``message`` then."""

    route: Required[str]
    ok: Required[bool | None]
    message: Required[str]
    path: str
    in_flight: int
    answers_expected: int
    answered: int
    refused: int
    other: list[str]
    charged: int | None
    spend_rows_answered: int | None
    failed: list[BurstFailure]


class BurstsSection(TypedDict):
    """``results["ledger"]["bursts"]``."""

    status: Literal["ok", "nonconforming", "unchecked", "refused"]
    routes: list[BurstRoute]
    message: str


class LedgerCheck(TypedDict, total=False):
    """One check of the ledger: ``ok`` None where it could not be observed."""

    check: Required[str]
    ok: Required[bool | None]
    reported: JsonValue
    expected: JsonValue
    #: The first mismatching figure, where the check is over many (``reported spent_epsilon
    #: after 2 answers``).
    where: str | None


#: A run's ledger verdict: ``bug`` where the reported noise admits fewer answers than the
#: claim implies.
LedgerStatus = Literal["ok", "nonconforming", "bug", "unchecked", "refused"]


class LedgerSection(TypedDict, total=False):
    """``results["ledger"]``: what the probe (:func:`.ledger.audit_ledger`) and the bursts
    found."""

    status: Required[LedgerStatus]
    message: str
    checks: Required[list[LedgerCheck]]
    budget: dict[str, float]
    mu_per_answer: float
    answers_expected: int
    answers_claimed: int | None
    answers: int
    refused_at: int | None
    bursts: BurstsSection


class ParameterVariant(TypedDict, total=False):
    """One variant of the sweep: the labels it released, or its refusal; ``route`` and
    ``sent`` (the body's extra fields) what it asked."""

    variant: Required[str]
    refused: Required[bool]
    message: str
    labels: dict[str, int]
    #: requests refused after the variant's first answer (a reason of the server's own)
    refusals: int
    #: a schema variant's screening answers (probes.parameters.SCREEN), never tested; a
    #: variant screened out has no ``labels``
    screening: dict[str, int]
    route: str
    sent: dict[str, JsonValue]


class ParametersSection(TypedDict, total=False):
    """``results["parameters"]``: whether a client parameter changes the release; ``variant``
    the one that changes it most, where the labels could be compared."""

    status: Required[Literal["ok", "nonconforming", "unchecked"]]
    message: Required[str]
    variants: list[ParameterVariant]
    per_variant: int
    per_schema_variant: int
    p_value: float | None
    variant: str
    label: str


#: A field's value as tested (a header's number or text, a chunk's flattened value).
Scalar = str | int | float | bool | None


class Answer(TypedDict):
    """One answer read whole (:func:`.answers.read_answer`); ``ttft_s`` a stream's seconds to
    its first token, where the client timed it."""

    answer: str
    fields: dict[str, Scalar]
    public: dict[str, JsonValue]
    tokens: int | None
    ttft_s: NotRequired[float | None]


class AboveLimit(TypedDict, total=False):
    """One request with ``max_tokens`` above the context's limit, and what came of it."""

    max_tokens: Required[int]
    outcome: Required[str]
    tokens: int | None


class SurfaceRoute(TypedDict, total=False):
    """One route's probe: only ``route`` and ``status`` for a route the server lacks."""

    route: Required[str]
    status: Literal["no-route"]
    answered: int
    other: list[str]
    #: requests refused for a reason of the server's own (:mod:`.refusals`)
    refused: int
    fields: list[str]
    above_limit: list[AboveLimit]


class PositionRow(TypedDict, total=False):
    """One probed prefix length's test (:func:`.positions.position_test`): the larger
    direction's lower bound, the event it counted, its held-out counts
    ``[k_a, n_a, k_b, n_b]`` and the bound it is held to."""

    position: int
    direction: str | None
    epsilon_lower: float
    event_texts: int
    event_ratio: float
    counts: list[int]
    bound: float
    exceeds: bool


class PositionsSection(TypedDict, total=False):
    """``results["surface"]["positions"]`` (:mod:`.positions`)."""

    per_world: int
    per_token_epsilon: float
    alpha: float
    positions: list[PositionRow]
    status: Required[Literal["ok", "nonconforming", "violation", "unchecked"]]
    message: Required[str]


class SurfaceSection(TypedDict, total=False):
    """``results["surface"]`` (:mod:`.surface`); ``status`` and ``message`` always set by
    :func:`.surface.audit_surface`'s end, ``field`` where a field depends on the world."""

    status: Literal["ok", "nonconforming", "violation", "bug", "unchecked", "refused"]
    message: str
    routes: Required[list[SurfaceRoute]]
    per_world: int
    dependence: Dependence | None
    public: list[str]
    limits: list[str]
    limit: int | None
    field: str | None
    #: the streamed routes' time to first token against the world, given the answer
    #: (:func:`dpicl_audit.estimators.channels.times_test`; issue 44)
    first_token: TimingTest | None
    #: the requests refused for a reason of the server's own, against the world (issue 44;
    #: :func:`dpicl_audit.probes.refusals.world_refusals`); None where none was
    refusals: RefusalTest | None
    #: DPS-MOZO: the per-token constraint position by position
    #: (:mod:`dpicl_audit.probes.positions`).
    positions: PositionsSection


class SwitchFinding(TypedDict):
    """One switched answer beyond the documented fields (:mod:`.switches`): the switch, the
    route, the status and the undocumented keys (``body debug.votes``, ``header x-debug``)."""

    switch: str
    route: str
    status_code: int
    extra: list[str]


class SwitchesSection(TypedDict):
    """``results["switches"]`` (:mod:`dpicl_audit.probes.switches`): ``routes`` those
    checked, ``switches`` how many were tried on each, ``refused`` the switched requests the
    server refused (4xx: fine)."""

    status: Literal["ok", "violation", "unchecked"]
    message: str
    routes: list[str]
    switches: int
    findings: list[SwitchFinding]
    refused: list[str]


class TailsSection(TypedDict, total=False):
    """``results["tails"]`` (:mod:`dpicl_audit.probes.tails`): whether the noise
    releases each label as often as its claimed Gaussian must; ``status`` and ``message``
    always set."""

    status: Required[Literal["ok", "nonconforming", "unchecked"]]
    message: Required[str]
    epsilon: float
    sigma: float
    partitions: int
    least_rate: float
    answers_needed: int
    answers: int
    labels: dict[str, int]
    p_value: float


class CalibrationPoint(TypedDict, total=False):
    """One epsilon of the calibration scan: ``refused`` above the server's limit."""

    epsilon: Required[float]
    status: Required[Literal["ok", "bug", "refused", "unchecked"]]
    sigma: float | None
    epsilon_exact: float | None
    message: str


class CalibrationSection(TypedDict):
    """``results["calibration"]`` (:mod:`.calibration`)."""

    status: Literal["ok", "bug"]
    message: str
    points: list[CalibrationPoint]


class LimitsWorld(TypedDict):
    """What one world answered to one query size of the limits probe (:mod:`.limits`):
    statuses by count, refusals' codes and (normalised) messages, the three most common, and
    how many refusals were charged (None where the context reports no count)."""

    answered: int
    refused: int
    statuses: dict[str, int]
    codes: dict[str, int]
    messages: dict[str, int]
    charged_refusals: int | None


class LimitsSize(TypedDict):
    """One query size of the limits probe, both worlds."""

    query_chars: int
    near: str
    C1: LimitsWorld
    C0: LimitsWorld


class LimitsSection(TypedDict, total=False):
    """``results["limits"]`` (:mod:`.limits`); ``size`` and ``field`` where a refusal's field
    depends on the world."""

    status: Required[Literal["ok", "violation", "unchecked"]]
    message: Required[str]
    route: str
    canary_chars: int
    max_query_chars: int | None
    per_size: int
    sizes: list[LimitsSize]
    p_value: float
    size: int
    field: str
