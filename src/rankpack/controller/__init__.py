"""Controller layer: drives simulations on a backend. The policy decides, the loop applies.

The pure decision step (no I/O, no clock), in the `pure` import contract:

- `decision`: the values it reads, remembers, is tuned by and returns (`Observations`,
  `ControllerState`, `ControllerSettings`, `Decision`);
- `policy`: `decide`: sizing, phases, fairness, wait modes; the failed-resize back-off;
- `staged`: what a staged simulation launches with (requests fitted, nodes, wait mode);
- `gate`: the launch gate (launch, backfill, pack); `gains`: its throughput models;
  `room`: where a launch may go and placement; `pacing`: the resize rate; `step`: a step's
  working state; `waits`: the wait rule.

The loop that applies it, one for `rankpack run`, `multiplex` and the operator:

- `loop`: the tick (observe, record, decide, apply); `schedule`: which simulations a tick
  observes; `recording`: what each observation leaves (samples, duty marks, restarts,
  shared time);
- `jobs`: where work comes from; `observing`: builds the observations (also for the dry
  run); `learned`: learned sizes;
- `launching`: applies `StageJob` and `Launch` (stage, stage ahead, launch, adopt);
  `requeue`: jobs handed back (a launch refused for quota, a lost node);
  `resizes`: each rank's resize until settled; `outcomes`: run rows and results, failure
  codes;
- `tracked`: what the loop holds; `views`: what it shows;
- `session`: multiplex sessions and what they are worth; `baselines`: the single runs a
  session is compared with, like for like (measured first when missing); `effects`: what
  else than co-location made a session differ from them (idle, staging ahead, wait modes).
"""
