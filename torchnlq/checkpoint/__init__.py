"""DCP checkpoints: save/resume, the run's record and metadata beside them, and their safe reader."""
