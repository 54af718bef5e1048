"""History: every gate run on the default branch, per kernel and shape, kept over time (docs/history.md).

model.py         Run (one recorded commit) and Point (one kernel and shape of it), from a report.json
store.py         the storage interface and its SQLite and PostgreSQL backends
gitbranch.py     the Action's backend: a JSON file on a data branch, pushed with retries
changepoints.py  change points of a series (ruptures' PELT), as commit ranges
ancestry.py      the runs in the order of the default branch's commit graph; commits off the branch
series.py        runs -> per kernel and shape series with their change points
"""
