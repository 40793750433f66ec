"""Report layer: what runs and sessions produced, rendered: terminal tables, live
displays, plots, the self-contained HTML report (`build`) and the demo's story (`story`)."""
