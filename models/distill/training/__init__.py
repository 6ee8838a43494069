"""Training the student: the loop (`trainer`), its losses (`loss`, `scores`), schedule, checkpoints, the ridge
initialization, int8 emulation and model soups."""
