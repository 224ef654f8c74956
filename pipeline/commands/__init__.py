"""The commands of `stepcast`, one module per command or family; pipeline/cli.py registers them on its app.

| module | commands |
|---|---|
| common.py | (what they share: consoles, settings, `fail`, `command` building flags from pipeline/options.py) |
| data.py | build, ingest, info |
| predict.py | predict |
| search.py | search |
| plan.py | plan |
| curves.py | curve, frontier |
| fit.py | fit |
| listing.py | list models, list gpus |
| explore.py | serve |
"""
