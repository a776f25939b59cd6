"""The metric kernel and what is computed from its output (one kernel for online and offline).

- ``options``: the kernel's options (cut-offs, gain, metric names) and their fingerprint.
- ``kernel``: per-request RR, NDCG@k, AP@k, P@k, recall@k and hit rate@k over many lists at once.
- ``auc``: pooled AUC-ROC and AUC-PR from a mergeable score histogram.
- ``gauc``: impression-weighted per-group AUC (GAUC) with its standard error.
- ``clusters``: request-clustered score histograms behind the clustered AUC standard errors.
- ``uncertainty``: standard errors and confidence intervals (pure functions of sufficient statistics).
- ``aggregates``: mergeable aggregates of a slice (counts, moments, histograms, clusters, positions).
- ``positions``: click-through by position as integer counts.
- ``drift``: PSI and KS of online scores against a baseline's quantile bins.
- ``result``: the result document built from aggregates.

Depends on nothing else in the core but ``slicing``: every other room stands on this one.
"""
