"""The audits from outside: what a run checks of the server beside its trials, each on
fresh contexts of its own, from what the run's mechanism supplies (its ingredients).

=====================  ===========================================================
module                 what it holds
=====================  ===========================================================
:mod:`.sections`       the shapes of the probes' results sections
:mod:`.ingredients`    what a mechanism supplies the probes (a context body, a way
                       to make one hold answers, the query, a capacity, its claim)
:mod:`.answers`        one raw request on any route, and its answer read whole
:mod:`.refusals`       a probe's refusals for a reason of the server's own, as
                       observations (tested against the world where both are asked)
:mod:`.ledger_burst`   the ledger under concurrency: N + k requests in flight per route
:mod:`.ledger`         the server's ledger: a probe context asked until refused
:mod:`.calibration`    the reported sigma against the claim at the epsilons the plan
                       does not audit (one context each, no answer)
:mod:`.client_schema`  every parameter of the routes' request schemas (the OpenAI
                       SDK's, the server's OpenAPI) and the values it is sent with
:mod:`.parameters`     the client parameters varied on every route (every schema's)
:mod:`.limits`        inputs at each documented limit: refusals, their messages and
                       charges alike in both worlds (:mod:`.limits_judge`: its test)
:mod:`.positions`      a generation's per-token bound, prefix length by prefix length
:mod:`.costs`          an answer's cost and budget against their prediction
:mod:`.surface`        every route's whole response (headers, stream chunks, usage) and
                       max_tokens against a generation context's limit
:mod:`.switches`       undocumented debug switches (query parameters, headers) on
                       every route: no answer beyond the documented fields
:mod:`.tails`          the noise's tails, black-box (a label the Gaussian must release)
:mod:`.registry`       PROBES: the one list (names, needs, deciding statuses)
=====================  ===========================================================

Below the plan and the results (they name the probes and read their statuses from
:mod:`.registry`) and above the client, the estimators and the verdicts; the mechanisms
(above) supply the ingredients and the pipeline makes the probes.
"""
