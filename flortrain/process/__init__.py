"""The processes of a record or a replay and the channel between them.

``flortrain record`` is up to four processes: the launcher (:mod:`.launcher`), which forks the
training process and commits what its checkpoint writer hands over; the static pass's forked
child (:mod:`.static_child`), which analyses the script while the parent imports torch; the
training process, whose start-up (:mod:`.training`) sets a session around the script and runs it
as ``__main__`` (:mod:`.as_main`); and the checkpoint writer the training process forks. They talk
through :mod:`.channel`. :mod:`.distributed` refuses what a distributed launch would break.
"""
