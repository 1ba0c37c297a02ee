"""``flortrain check``: static analysis of training scripts for what would make a run unreplayable
or nondeterministic, found before training starts (DETrain's RNG-safety analysis and every replay
hazard flortrain knows). Nothing is run and torch is never imported: the pre-commit hook installs
with libcst and click alone."""
