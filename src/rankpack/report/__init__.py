"""Report layer: what runs and sessions produced, rendered: terminal tables, live
displays, plots, the self-contained HTML report and the demo's story.

Modules:

- `tables`: the tables a user reads at the end of a run, in ``rankpack runs`` and ``profile``;
- `live`: the live display of a running simulation; `multiplex_live`: of a multiplex session;
- `top`: ``rankpack top``'s view of a cluster's Simulations, ranks and nodes (pure), and
  its tables;
- `dashboard`: ``rankpack dashboard``'s history of successive top views, what its page
  draws (pure: residual curves, duty heat maps, requests against use, the co-location gain
  so far); the page itself is package data beside it, ``page/``;
- `glance`: what a glance at a running simulation shows (ETA, duty, efficiency, nodes,
  residuals), pure, shared by the Simulation's status and the live views;
- `timeline`: a multiplex session's timeline PNG;
- `data`: what a report shows of a run or a session, read from the store and the solver log;
- `figures`: the report's figures as PNG bytes;
- `html`: one self-contained HTML page from a report document;
- `build`: `rankpack report`, putting `data`, `figures` and `html` together;
- `story`: the demo's story in numbers and words (summary, tables, JSON);
- `gain`: a session's co-location gain in words, every other effect named apart (pure).
"""
