"""Building blocks of `scripts/train_router.py` and `scripts/eval_routing.py`."""
