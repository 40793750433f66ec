"""Report layer: results of runs as typed values, tables, live display and plots."""
