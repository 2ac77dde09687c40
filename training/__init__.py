"""The training engine's parts that stand alone: optimisers, schedules and weight averages from a recipe
(`training.optim`), and statistics of the training data some models read (`training.word_statistics`)."""
