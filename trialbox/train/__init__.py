"""Training: advantage estimators and losses as small pure functions (`losses.py`), the
tiny demo model (`model.py`), the demo task family (`demo_tasks.py`), a supervised
warm start (`sft.py`) and the GRPO trainer that reads top to bottom (`trainer.py`).

See docs/training.md.
"""
