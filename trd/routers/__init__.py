"""Training router heads (citer, r2r, collm) for one's own small/large pair:
`tokenrouterd train-router` (trd/routers/train.py)."""
