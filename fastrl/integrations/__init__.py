"""fastrl inside the trainers people already run: TRL's `GRPOTrainer` and verl's actor.

    from fastrl.integrations.trl import FastRLGRPOTrainer      # needs trl
    import fastrl.integrations.verl                             # needs verl; registers loss_mode="fastrl"

Each submodule imports its trainer's package; this package imports neither, so `import fastrl.integrations`
works without them.
"""

__all__ = ["trl", "verl"]
