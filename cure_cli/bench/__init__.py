"""`cure bench` internals: the interleaved loop (runner), metrics (stats), task scoring (scoring),
tables and output files (report), and figures (plots, matplotlib imported only for --plot)."""
