"""The training engine: `config` (TrainConfig from a paper's recipe), `data` and `rows` (what a run reads),
`models`, `loop` (the per-worker loop), `trainer` (the driver, the only place that starts Ray Train),
`evaluation`, `checkpoints`, `progress`, `optim` (a recipe applied) and `word_statistics`."""
