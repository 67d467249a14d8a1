"""Every output mmlab makes, by format, for every stage below (an
experiment, attribution, kernels, the fleet, the census, the tracker):
terminal/ (rich tables, one module per subject), text, html (templates/),
csv, json, plots and flamegraph; fmt writes every number for all of them.
An experiment's report data (data), its evidence bundle and reproducers,
and the tracker's dashboard directory are written from them."""
