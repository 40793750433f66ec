"""Controller layer: drives simulations on a backend. The policy decides, the loop applies.

The pure decision step (no I/O, no clock), in the `pure` import contract:
`observations` (what it reads and returns), `policy` (`decide`: sizing, phases, fairness,
wait modes; the failed-resize back-off), `gate` (launch, backfill, pack, launch fitting),
`step` (a step's working state), `waits` (the wait rule).

The loop that applies it, one for `rankpack run`, `multiplex` and the operator: `loop`
(the tick: observe, record, decide, apply), `jobs` (where work comes from), `observing`
(the policy's observations, also for the dry run), `launching` (stage, launch, adopt),
`resizes` (each rank's resize until settled), `outcomes` (run rows and results, failure
codes), `tracked` (what the loop holds), `views` (what it shows). Around it: `session`
(multiplex sessions and what they are worth), `learned` (learned sizes), `submission`.
"""
